// See report.h. Charts are drawn here as SVG: a frame, "nice" ticks, one polyline per
// series (eval series also get a dot per point), a legend; a log axis for the loss
// scale.
#include "runtime/report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "data/atomic_file.h"

namespace dtrain::runtime {

namespace fs = std::filesystem;

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"};

struct Series {
  std::string name;  // legend and data-series
  std::vector<std::pair<double, double>> points;
  bool dots = false;  // eval points: few, each marked
};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Up to ~5 round tick values covering [lo, hi] (`integers`: steps, 1 apart at least).
std::vector<double> ticks(double lo, double hi, bool integers = false) {
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / 4;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  if (integers) step = std::max(std::ceil(step), 1.0);
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);  // no "-0" from the additions
  return t;
}

std::string label(double v) {
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-3)) return fmt::format("{:.2g}", v);
  return fmt::format("{:.4g}", v);
}

// One chart; `log_y` plots log10 of the values (all must be positive).
std::string chart(const std::string& title, const std::string& y_unit,
                  const std::vector<Series>& all, bool log_y = false, double hline = std::nan(""),
                  const std::string& hline_label = "") {
  std::vector<Series> series;
  for (const Series& s : all)
    if (!s.points.empty()) series.push_back(s);
  if (series.empty()) return {};
  constexpr double W = 560, H = 246, L = 64, R = 12, T = 28, B = 50;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  auto fy = [log_y](double v) { return log_y ? std::log10(std::max(v, 1e-300)) : v; };
  for (const Series& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, fy(y)), y1 = std::max(y1, fy(y));
    }
  if (std::isfinite(hline)) y0 = std::min(y0, fy(hline)), y1 = std::max(y1, fy(hline));
  if (x0 > x1) return {};
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + (y0 == 0 ? 1 : std::fabs(y0) * 0.1), y0 -= (y1 - y0);
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (fy(y) - y0) / (y1 - y0)) * (H - T - B); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "role=\"img\" aria-label=\"{}\">\n<text x=\"{}\" y=\"18\" class=\"t\">{}</text>\n"
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"f\"/>\n",
      W, H, W, H, escape(title), L, escape(title), L, T, W - L - R, H - T - B);
  for (double t : ticks(y0, y1)) {
    const double y = T + (1 - (t - y0) / (y1 - y0)) * (H - T - B);
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" class=\"g\"/><text x=\"{}\" "
        "y=\"{:.1f}\" class=\"yl\">{}</text>\n",
        L, y, W - R, y, L - 4, y + 4, escape(label(log_y ? std::pow(10.0, t) : t)));
  }
  for (double t : ticks(x0, x1, true)) {
    const double x = px(t);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"xl\">{}</text>\n", x, H - B + 14,
                       label(t));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"xl\">step</text>\n", W - R - 12, H - B + 28);
  if (!y_unit.empty())
    svg += fmt::format("<text x=\"4\" y=\"{}\" class=\"u\">{}</text>\n", T - 6, escape(y_unit));
  if (std::isfinite(hline)) {
    const double y = py(hline);
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" class=\"h\"/><text x=\"{}\" "
        "y=\"{:.1f}\" class=\"hl\">{}</text>\n",
        L, y, W - R, y, W - R - 4, y - 4, escape(hline_label));
  }
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const char* color = kColors[i % std::size(kColors)];
    std::string pts, data;
    for (const auto& [x, y] : s.points) {
      data += fmt::format("{}{}:{:.9g}", data.empty() ? "" : " ", x, y);
      if (!std::isfinite(y)) continue;
      pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    }
    svg += fmt::format(
        "<polyline data-series=\"{}\" data-points=\"{}\" points=\"{}\" fill=\"none\" "
        "stroke=\"{}\" stroke-width=\"1.6\"/>\n",
        escape(s.name), data, pts, color);
    if (s.dots) {
      for (const auto& [x, y] : s.points)
        if (std::isfinite(y))
          svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(x),
                             py(y), color);
    }
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"3\" fill=\"{}\"/><text x=\"{}\" y=\"{}\" "
        "class=\"lg\">{}</text>\n",
        L + 150 * static_cast<double>(i), H - 12, color, L + 14 + 150 * static_cast<double>(i),
        H - 7, escape(s.name));
  }
  return svg + "</svg>\n";
}

// Field `key` of a line where it is a number (a line of another version, or a damaged one,
// may lack it or hold something else: that field is left out, never the report).
std::optional<double> number(const nlohmann::json& j, const std::string& key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// Series `key` of the train (or eval) lines, times `scale`.
Series series_of(const std::vector<nlohmann::json>& lines, const std::string& key,
                 const std::string& name, double scale = 1.0, bool dots = false) {
  Series s{name, {}, dots};
  for (const nlohmann::json& j : lines) {
    const std::optional<double> step = number(j, "step"), v = number(j, key);
    if (step && v) s.points.emplace_back(*step, *v * scale);
  }
  return s;
}

// A window's sum (comm_time_s: every step of the line's window) over its per-step
// `per_step`, as a share of one step: the sum divided by the window's steps
// (window_steps; a line without it, from before it was written: the steps since the
// line before).
Series share_of_step(const std::vector<nlohmann::json>& lines, const std::string& sum,
                     const std::string& per_step, const std::string& name) {
  Series s{name, {}, false};
  double previous = 0;
  for (const nlohmann::json& j : lines) {
    const std::optional<double> step = number(j, "step"), x = number(j, sum),
                                y = number(j, per_step), n = number(j, "window_steps");
    if (!step) continue;
    const double steps = n ? *n : std::max(1.0, *step - previous);
    previous = *step;
    if (x && y && *y > 0 && steps > 0) s.points.emplace_back(*step, 100.0 * *x / steps / *y);
  }
  return s;
}

bool flag(const nlohmann::json& j, const std::string& key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string gb(double bytes) { return fmt::format("{:.3f} GB", bytes / 1e9); }

}  // namespace

std::string render_report(const fs::path& run_dir) {
  const fs::path metrics = run_dir / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in) {
    throw Error(fmt::format("{}: cannot read it", metrics.string()),
                "pass the run.output_dir of a run with logging.jsonl: true");
  }
  // A run still going, stopped or killed has no summary line yet; a torn or foreign line
  // is skipped.
  std::vector<nlohmann::json> train, eval;
  nlohmann::json summary = nlohmann::json::object();
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (flag(j, "summary")) {
      summary = j;
    } else if (flag(j, "eval")) {
      eval.push_back(j);
    } else if (number(j, "loss") && number(j, "step")) {
      train.push_back(j);
    }
  }
  if (train.empty()) {
    throw Error(fmt::format("{}: no train line", metrics.string()),
                "a run logs one every train.log_every steps; report on a run that took one");
  }
  const bool language = !eval.empty() && eval.back().contains("test_perplexity");
  // optimizer.ema: evaluations of the average are a series of their own (a run resumed
  // with the average switched on or off has both kinds).
  std::vector<nlohmann::json> eval_model, eval_ema;
  for (const nlohmann::json& e : eval)
    (e.value("weights", std::string()) == "ema" ? eval_ema : eval_model).push_back(e);
  const auto test_series = [&](const std::string& key, const std::string& label, double scale) {
    return std::vector<Series>{series_of(eval_model, key, label, scale, true),
                               series_of(eval_ema, key, label + " (EMA weights)", scale, true)};
  };
  // train.best: the best evaluation so far (the last eval line's best_step) drawn as a
  // line on its metric's chart (the summary names the metric; loss while a run goes on).
  double best_loss = NAN, best_accuracy = NAN;
  std::string best_label;
  if (const std::optional<double> at =
          eval.empty() ? std::nullopt : number(eval.back(), "best_step")) {
    const bool by_accuracy = eval.back().value("best_metric", std::string()) == "accuracy";
    for (const nlohmann::json& e : eval) {
      if (number(e, "step") != at) continue;
      const double v = number(e, by_accuracy ? "test_accuracy" : "test_loss").value_or(NAN);
      (by_accuracy ? best_accuracy : best_loss) = by_accuracy ? 100 * v : v;
      best_label = fmt::format("best, step {}{}", *at,
                               summary.value("stopped_early", false) ? " (stopped early)" : "");
    }
  }
  std::string body;
  std::vector<Series> losses = test_series("test_loss", "test loss", 1.0);
  losses.insert(losses.begin(), series_of(train, "loss", "train loss"));
  body += chart("Loss", "", losses, false, best_loss, best_label);
  if (language) {
    body += chart("Perplexity (test)", "", test_series("test_perplexity", "test perplexity", 1.0));
  }
  body +=
      chart(language ? "Token accuracy (test)" : "Accuracy (test)", "%",
            test_series("test_accuracy", "test accuracy", 100.0), false, best_accuracy, best_label);
  body += chart("Learning rate", "", {series_of(train, "lr", "lr")});
  body += chart("Loss scale", "", {series_of(train, "loss_scale", "loss scale")}, true);
  body += chart("Skipped steps (total)", "", {series_of(train, "skipped_steps", "skipped")});
  body += chart("Throughput", "samples/s", {series_of(train, "samples_per_s", "samples/s")});
  body += chart("Tokens", "tokens/s", {series_of(train, "tokens_per_s", "tokens/s")});
  body += chart("Model FLOP/s (per rank)", "GFLOP/s",
                {series_of(train, "model_gflops_per_s", "model GFLOP/s")});
  body += chart("MFU", "%", {series_of(train, "mfu", "MFU", 100.0)});
  const auto est_it = summary.find("memory_estimate");
  const nlohmann::json est =
      est_it != summary.end() && est_it->is_object() ? *est_it : nlohmann::json::object();
  const std::optional<double> est_peak = number(est, "peak_bytes");
  const bool cuda = !train.empty() && train.back().contains("peak_device_bytes");
  body += chart("Memory", "GB",
                {series_of(train, cuda ? "peak_device_bytes" : "peak_host_bytes",
                           cuda ? "peak (device)" : "peak (allocator)", 1e-9),
                 series_of(train, "host_rss_bytes", "resident (process)", 1e-9)},
                false, est_peak ? *est_peak * 1e-9 : NAN, "estimate");
  body += chart("Communication share of the step", "%",
                {share_of_step(train, "comm_time_s", "step_time_s", "communication"),
                 share_of_step(train, "exposed_comm_s", "step_time_s", "exposed")});
  body += chart("Data-loader wait", "ms", {series_of(train, "data_wait_s", "wait", 1e3)});

  std::string by_kind;
  if (est.contains("by_kind") && est["by_kind"].is_object()) {
    double most = 0;
    for (const auto& [k, v] : est["by_kind"].items())
      if (v.is_number()) most = std::max(most, v.get<double>());
    for (const auto& [k, v] : est["by_kind"].items()) {
      if (!v.is_number()) continue;
      by_kind += fmt::format(
          "<tr><td>{}</td><td class=\"n\">{}</td><td><div class=\"bar\" style=\"width:{:.0f}px\">"
          "</div></td></tr>\n",
          escape(k), gb(v.get<double>()), most > 0 ? 240.0 * v.get<double>() / most : 0.0);
    }
  }
  std::string summary_rows;
  for (const auto& [k, v] : summary.items()) {
    if (k == "memory_estimate" || k == "summary") continue;
    summary_rows += fmt::format("<tr><td>{}</td><td class=\"n\">{}</td></tr>\n", escape(k),
                                escape(v.is_string() ? v.get<std::string>() : v.dump()));
  }
  const std::string job = read_text(run_dir / "job.yaml");
  const std::string name = run_dir.filename().string();
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>dtrain report: "
      "{}</"
      "title>\n<style>\nbody{{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}}\n"
      "h1{{font-size:22px}} h2{{font-size:17px;margin-top:28px}}\n"
      ".charts{{display:flex;flex-wrap:wrap;gap:12px}}\nsvg{{background:#fff;border:1px solid "
      "#ddd}}\n.t{{font-size:13px;font-weight:bold}} .yl{{font-size:10px;text-anchor:end}}\n"
      ".xl{{font-size:10px;text-anchor:middle}} .u{{font-size:10px}} .lg{{font-size:11px}}\n"
      ".f{{fill:none;stroke:#999}} .g{{stroke:#eee}} .h{{stroke:#888;stroke-dasharray:4 3}}\n"
      ".hl{{font-size:10px;text-anchor:end;fill:#555}}\ntable{{border-collapse:collapse;"
      "font-size:13px}} td{{padding:2px 10px;border-bottom:1px solid #eee}}\n"
      ".n{{text-align:right;font-family:monospace}} .bar{{height:10px;background:#1f77b4}}\n"
      "pre{{background:#f6f6f6;padding:10px;font-size:12px;overflow:auto}}\n</style></head>\n"
      "<body>\n<h1>dtrain report: {}</h1>\n<p>{} train lines, {} evaluations; {} steps{}.</p>\n"
      "<div class=\"charts\">\n{}</div>\n<h2>Memory by kind (dtrain estimate, per rank)</h2>\n"
      "<table>\n{}</table>\n<h2>Summary</h2>\n<table>\n{}</table>\n<h2>Job (resolved)</h2>\n"
      "<pre>{}</pre>\n</body></html>\n",
      escape(name), escape(name), train.size(), eval.size(),
      static_cast<int64_t>(number(summary, "steps").value_or(*number(train.back(), "step"))),
      summary.value("stopped_early", false) ? "; stopped early (train.best.patience)" : "", body,
      by_kind, summary_rows, escape(job));
}

void write_report(const fs::path& run_dir, const fs::path& out) {
  write_file_atomic(out.string(), {render_report(run_dir)});
}

}  // namespace dtrain::runtime
