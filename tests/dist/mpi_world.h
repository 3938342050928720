// The world communicator of the MPI test run (see test_mpi_main.cpp).
#pragma once

#include "dist/communicator.h"

dtrain::dist::Communicator& test_world();
