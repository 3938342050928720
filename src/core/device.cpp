// Device parsing and printing.
#include "core/device.h"

#include <charconv>

#include "core/error.h"

namespace dtrain {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view num = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && end == num.data() + num.size() && index >= 0 && index < 1024) {
      return cuda(index);
    }
  }
  throw Error(fmt::format("unknown device \"{}\"", text), "use cpu, cuda or cuda:N (N >= 0)");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

}  // namespace dtrain
