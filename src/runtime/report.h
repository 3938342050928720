// The run report: one self-contained HTML file (inline SVG charts and CSS, no
// JavaScript, nothing fetched) from a run directory's metrics.jsonl, summary.json and
// job.yaml: training and evaluation loss, accuracy or perplexity, learning rate, loss
// scale and skipped steps, throughput and model FLOP/s (MFU where the peak is known),
// memory against dtrain estimate's peak and its breakdown by kind, the communication
// share of the step, then the summary and the resolved job. `dtrain report RUN_DIR`
// writes it; so does every run at its end (<output_dir>/report.html).
// Each chart's series carry their data (data-series, data-points="step:value ...") so
// a test can check the drawing against metrics.jsonl.
#pragma once

#include <filesystem>
#include <string>

namespace dtrain::runtime {

// The report of `run_dir` as HTML. Throws Error (exit 2) naming the file when
// metrics.jsonl is missing or holds no train line.
std::string render_report(const std::filesystem::path& run_dir);
// render_report, written atomically to `out`.
void write_report(const std::filesystem::path& run_dir, const std::filesystem::path& out);

}  // namespace dtrain::runtime
