// What the process launcher (mpirun, srun) tells us through the environment.
#pragma once

namespace dtrain::cli {

// The rank count a launcher advertises (Open MPI, MPICH/PMI, SLURM), else 1.
// A malformed value is an Error naming the variable.
int world_from_env();

}  // namespace dtrain::cli
