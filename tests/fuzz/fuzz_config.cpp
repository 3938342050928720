// libFuzzer target for the job-file loader: any input must either load or throw
// dtrain::Error; anything else (a crash, a sanitizer report, InternalError, another
// exception) is a bug. A loaded job must also dump and reload to the same text.
// Input: YAML text; a first line "#!set a.b=v" adds that --set override.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  if (text.starts_with("#!set ")) {
    const size_t end = text.find('\n');
    overrides.emplace_back(text.substr(6, end == std::string_view::npos ? end : end - 6));
  }
  dtrain::config::ValidateContext ctx;
  ctx.world_size = 1 << (size % 4);  // 1, 2, 4 or 8 ranks
  std::string first;
  try {
    first = dtrain::config::dump_job_yaml(
        dtrain::config::load_job_text(text, "fuzz.yaml", overrides, ctx));
  } catch (const dtrain::Error&) {
    return 0;  // a user error: expected
  }
  // The resolved dump must load (without the overrides: they are in it) to the same dump.
  const std::string second =
      dtrain::config::dump_job_yaml(dtrain::config::load_job_text(first, "dump.yaml", {}, ctx));
  if (second != first) std::abort();
  return 0;
}
