// dtrain's entry point: parses the command line and dispatches to one subcommand.
// Maps errors to the documented exit codes; no work happens here.
#include <cstdio>

#include <exception>
#include <string>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "core/error.h"
#include "dist/launcher.h"
#include "runtime/startup.h"

int main(int argc, char** argv) {
  using namespace dtrain::cli;
  CLI::App app{"dtrain: train deep models from a YAML job file", "dtrain"};
  app.require_subcommand(0, 1);
  Action action;
  add_version(app, action);
  add_info(app, action);
  add_bench(app, action);
  add_report(app, action);
  add_validate(app, action);
  add_estimate(app, action);
  add_plan(app, action);
  add_train(app, action);
  add_generate(app, action);
  add_predict(app, action);
  add_data(app, action);
  add_ckpt(app, action);
  bool show_version = false;
  app.add_flag("--version", show_version, "print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e) == 0 ? kExitOk : kExitBadInput;  // --help
    std::fprintf(stderr, "dtrain: error: %s\n  hint: see dtrain --help, or dtrain COMMAND --help\n",
                 e.what());
    return kExitBadInput;
  }
  // One of several ranks: every message says which.
  const std::string who = dtrain::dist::launcher_world_size().value_or(1) > 1
                              ? fmt::format("dtrain[rank {}]", dtrain::dist::launcher_rank())
                              : "dtrain";
  try {
    if (show_version) return run_version();
    if (!action) {
      std::fputs(app.help().c_str(), stdout);
      std::fputs("dtrain: error: no command given (one of those above)\n", stderr);
      return kExitBadInput;
    }
    return action();
  } catch (const dtrain::runtime::PeerFailed& e) {
    return e.code;  // the failing rank printed why
  } catch (const dtrain::RunError& e) {
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.what());
    return kExitRuntime;
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.what());
    return kExitBadInput;
  } catch (const dtrain::InternalError& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return kExitInternal;
  } catch (const std::exception& e) {  // escaped every check: a dtrain bug, said as one
    std::fprintf(stderr, "%s: internal error (a dtrain bug; please report it): %s\n", who.c_str(),
                 e.what());
    return kExitInternal;
  }
}
