// Main of the MPI tests: the world communicator lives for the whole run (created
// before the cases, destroyed before MPI is finalised at exit); every rank runs
// every case in the same order.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "mpi_world.h"

namespace {
dtrain::dist::Communicator* g_world = nullptr;
}

dtrain::dist::Communicator& test_world() { return *g_world; }

int main(int argc, char** argv) {
  auto world = dtrain::dist::make_world_communicator();
  g_world = world.get();
  doctest::Context context(argc, argv);
  const int failed = context.run();
  world.reset();
  return failed;
}
