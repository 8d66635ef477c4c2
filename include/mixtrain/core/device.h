// Device: where a tensor's storage lives. "cpu" today; the type also names CUDA devices ("cuda:0"),
// so the dispatch seam and the allocators can key on it before a GPU backend exists.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mixtrain {

enum class DeviceType : uint8_t { kCpu = 0, kCuda };
constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // which device of that type (always 0 for the CPU)

  static Device cpu() { return {DeviceType::kCpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  std::string str() const;  // "cpu", "cuda:1"
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Parses "cpu", "cuda" (device 0) or "cuda:N"; Error naming the valid forms otherwise.
Device parse_device(std::string_view text);
const char* device_type_name(DeviceType type);

}  // namespace mixtrain
