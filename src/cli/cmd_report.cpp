// `dtrain report RUN_DIR [--out FILE.html]`: the run report (runtime/report.h), by
// default RUN_DIR/report.html (every run also writes it at its end).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "runtime/report.h"

namespace dtrain::cli {

namespace {

struct ReportArgs {
  std::string run_dir, out;
};

int run_report(const ReportArgs& a) {
  const std::filesystem::path out = a.out.empty() ? std::filesystem::path(a.run_dir) / "report.html"
                                                  : std::filesystem::path(a.out);
  runtime::write_report(a.run_dir, out);
  std::printf("wrote %s\n", out.c_str());
  return kExitOk;
}

}  // namespace

void add_report(CLI::App& app, Action& action) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report", "one self-contained HTML page of a run's charts, summary and job");
  cmd->add_option("run_dir", args->run_dir, "the run's output_dir")->required();
  cmd->add_option("--out", args->out, "where to write it (default RUN_DIR/report.html)");
  cmd->callback([args, &action] { action = [args] { return run_report(*args); }; });
}

}  // namespace dtrain::cli
