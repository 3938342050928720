// Where a tensor lives: the host (cpu) or a CUDA device (cuda:N).
#pragma once

#include <string>
#include <string_view>

namespace dtrain {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  // Accepts "cpu", "cuda", "cuda:N"; throws Error otherwise.
  static Device parse(std::string_view text);

  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

}  // namespace dtrain
