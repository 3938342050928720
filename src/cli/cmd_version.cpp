// `dtrain version` / `dtrain --version`.
#include <cstdio>

#include "cli/commands.h"

namespace dtrain::cli {

int run_version() {
  std::printf("dtrain %s\n", DTRAIN_VERSION);
  return kExitOk;
}

void add_version(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("version", "print the version");
  cmd->callback([&action] { action = run_version; });
}

}  // namespace dtrain::cli
