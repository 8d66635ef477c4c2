#include "mixtrain/core/device.h"

#include <charconv>

#include "mixtrain/core/error.h"

namespace mixtrain {

const char* device_type_name(DeviceType type) { return type == DeviceType::kCpu ? "cpu" : "cuda"; }

std::string Device::str() const {
  if (type == DeviceType::kCpu) return "cpu";
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.substr(0, 5) == "cuda:" && text.size() > 5) {
    int index = -1;
    const auto [end, ec] = std::from_chars(text.data() + 5, text.data() + text.size(), index);
    if (ec == std::errc() && end == text.data() + text.size() && index >= 0 && index < 1024) return Device::cuda(index);
  }
  MIXTRAIN_FAIL(kInvalidInput, "unknown device '" << text << "'", "valid devices are cpu, cuda and cuda:N");
}

}  // namespace mixtrain
