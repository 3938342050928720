// The self communicator (world of one): collectives are the identity or a copy,
// point-to-point is an internal error, every call is counted; `auto` tuning and
// the launcher environment work without MPI.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "dist/allreduce.h"
#include "dist/communicator.h"
#include "dist/launcher.h"

using namespace dtrain;
using namespace dtrain::dist;

TEST_CASE("self communicator: identity collectives, counted") {
  auto comm = make_self_communicator();
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(comm->backend() == "self");
  std::vector<float> v{1.0f, -2.0f, 3.5f};
  Tensor t = Tensor::wrap(v.data(), {3}, DType::f32);
  Handle h = comm->all_reduce_async(t, ReduceOp::sum, AllreduceAlgo::ring);
  CHECK(h.valid());
  CHECK(h.test());
  h.wait();
  comm->all_reduce(t, ReduceOp::max);
  CHECK(v == std::vector<float>{1.0f, -2.0f, 3.5f});

  std::vector<double> in{1, 2}, out(2);
  Tensor ti = Tensor::wrap(in.data(), {2}, DType::f64),
         to = Tensor::wrap(out.data(), {2}, DType::f64);
  comm->reduce_scatter(ti, to);
  CHECK(out == in);
  out = {0, 0};
  comm->all_gather(ti, to);
  CHECK(out == in);
  out = {0, 0};
  CHECK(comm->all_to_all_async(ti, to).test());
  CHECK(out == in);
  comm->broadcast(to, 0);
  comm->barrier();
  auto child = comm->split(0, 0);
  CHECK(child->size() == 1);

  const CommStats s = comm->stats();
  CHECK(s.calls == 8);
  CHECK(s.completed == 8);
  CHECK(s.bytes == 12 + 12 + 16 + 16 + 16 + 16);
  const OpRecord last = comm->last_op();
  CHECK(last.seq == 8);
  CHECK(last.op == "split");
  CHECK(comm->topology().nodes == 1);
}

TEST_CASE("self communicator: misuse is an internal error") {
  auto comm = make_self_communicator();
  std::vector<float> v(2);
  Tensor t = Tensor::wrap(v.data(), {2}, DType::f32);
  CHECK_THROWS_AS(comm->send(t, 0), InternalError);
  CHECK_THROWS_AS(comm->recv(t, 0), InternalError);
  CHECK_THROWS_AS(comm->all_reduce(t, ReduceOp::sum, AllreduceAlgo::auto_), InternalError);
  CHECK_THROWS_AS(comm->broadcast(t, 1), InternalError);
  CHECK_THROWS_AS(comm->all_gatherv_async(t, {1}), InternalError);  // counts sum to 1, not 2
  CHECK(comm->all_gatherv_async(t, {2}).test());
  std::vector<uint8_t> bytes(2);
  Tensor u8 = Tensor::wrap(bytes.data(), {2}, DType::u8);
  CHECK_THROWS_AS(comm->all_reduce(u8), InternalError);
  CHECK_THROWS_AS(Handle().wait(), InternalError);
}

TEST_CASE("auto tuning over one rank: a table, one row per size class") {
  auto comm = make_self_communicator();
  const AutoChoice choice = tune_allreduce(*comm, {4096, 4000, 1 << 20, 3 << 20}, 2);
  REQUIRE(choice.entries.size() == 3);  // 4096 and 4000 share the 4 KiB class
  CHECK(choice.entries[0].bytes == 4096);
  CHECK(choice.entries[1].bytes == (1 << 20));
  CHECK(choice.entries[2].bytes == (3 << 20));
  for (const AutoEntry& e : choice.entries) CHECK(e.seconds.size() == 2);  // no hierarchical
  CHECK(choice.algo_for(100) == choice.entries[0].algo);
  CHECK(choice.algo_for(size_t{1} << 30) == choice.entries[2].algo);
  CHECK(AutoChoice{}.algo_for(10) == AllreduceAlgo::native);
  const std::string text = format_auto_choice(choice);
  CHECK(text.find("4.0 KiB") != std::string::npos);
  CHECK(text.find("native") != std::string::npos);
}

TEST_CASE("launcher environment") {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_NTASKS"}) {
    unsetenv(name);
  }
  CHECK_FALSE(launcher_world_size().has_value());
  CHECK_FALSE(started_by_mpi_launcher());
  setenv("SLURM_NTASKS", "3", 1);
  CHECK(launcher_world_size() == 3);
  CHECK_FALSE(started_by_mpi_launcher());
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  CHECK(launcher_world_size() == 2);
  CHECK(started_by_mpi_launcher());
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("SLURM_NTASKS");
  CHECK(make_world_communicator()->backend() == "self");
  CHECK_THROWS_AS(make_world_communicator({0}), Error);
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    unsetenv(name);
  }
  CHECK_FALSE(launcher_local_rank().has_value());
  setenv("SLURM_LOCALID", "3", 1);
  CHECK(launcher_local_rank() == 3);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  CHECK(launcher_local_rank() == 1);
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
}

// srun or mpirun without OMP_NUM_THREADS: each rank takes --cpus-per-task, or its share of
// the cores, instead of a pool as wide as the machine.
TEST_CASE("threads per rank without OMP_NUM_THREADS") {
  const char* names[] = {
      "OMP_NUM_THREADS",       "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
      "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",  "SLURM_CPUS_PER_TASK",
      "SLURM_STEP_ID"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* name : names) {
    if (const char* v = std::getenv(name)) saved.emplace_back(name, v);
    unsetenv(name);
  }
  CHECK_FALSE(launcher_local_size().has_value());
  CHECK_FALSE(threads_per_rank(8).has_value());  // one rank: OpenMP's default
  setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)", 1);
  CHECK(launcher_local_size() == 4);
  REQUIRE(threads_per_rank(8).has_value());
  CHECK(threads_per_rank(8)->threads == 2);
  CHECK(threads_per_rank(2)->threads == 1);  // oversubscribed: at least one
  setenv("SLURM_NTASKS_PER_NODE", "8", 1);   // the allocation's; this step runs 4 here
  CHECK(launcher_local_size() == 4);
  setenv("SLURM_CPUS_PER_TASK", "3", 1);  // outside an srun step: not this rank's
  CHECK(threads_per_rank(8)->threads == 2);
  setenv("SLURM_STEP_ID", "0", 1);
  CHECK(threads_per_rank(8)->threads == 3);
  CHECK(std::string(threads_per_rank(8)->source) == "SLURM_CPUS_PER_TASK");
  CHECK(threads_per_rank(2)->threads == 2);      // at most the CPUs this process may use
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);  // mpirun inside an allocation
  CHECK(launcher_local_size() == 2);
  CHECK(threads_per_rank(8)->threads == 4);
  CHECK(usable_cpus() >= 1);
  setenv("OMP_NUM_THREADS", "5", 1);  // the user's choice stands
  CHECK_FALSE(threads_per_rank(8).has_value());
  for (const char* name : names) unsetenv(name);
  for (const auto& [name, value] : saved) setenv(name.c_str(), value.c_str(), 1);
}
