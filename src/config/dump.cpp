// The resolved job as YAML: every key of the schema in schema order, block style
// for sections, inline values; strings always double-quoted so they read back as
// strings. load_job_text(dump_job_yaml(job)) gives the same job.
#include "config/fields.h"

namespace dtrain::config {
namespace {

void dump_section(const Field& section, const Job& job, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  for (const auto& f : section.children) {
    if (f.is_section()) {
      out += pad + f.key + ":\n";
      dump_section(f, job, indent + 2, out);
    } else {
      out += pad + f.key + ": " + f.dump(job) + "\n";
    }
  }
}

}  // namespace

std::string dump_job_yaml(const Job& job) {
  std::string out;
  dump_section(job_schema(), job, 0, out);
  return out;
}

}  // namespace dtrain::config
