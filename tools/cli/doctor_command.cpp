// mixtrain doctor: what this machine offers for mixed precision, measured with mixtrain's own kernels.
#include <iostream>

#include "args.h"
#include "commands.h"
#include "mixtrain/core/error.h"
#include "mixtrain/distributed/device_communicator.h"
#include "mixtrain/precision/doctor.h"

namespace mixtrain::cli {

int doctor_command(const std::vector<std::string>& argv) {
  Args a(argv, {"json", "seconds"});
  const double seconds = a.number("seconds", 1.0);
  if (!(seconds > 0 && seconds <= 3600))
    MIXTRAIN_FAIL(kInvalidInput, "--seconds must be in (0, 3600], got " << seconds,
                  "about 1 second gives a stable measurement");
  const std::string json_path = a.path("json");
  if (a.has("json") && json_path.empty()) MIXTRAIN_FAIL(kInvalidInput, "--json needs a file name", "");

  DoctorReport report = run_doctor(seconds);
  report.nccl = nccl_status().detail;
  std::cout << format_doctor(report) << std::flush;
  if (!json_path.empty()) {
    write_file_atomically(json_path, doctor_to_json(report).dump(2) + "\n");
    std::cout << "wrote " << json_path << "\n";
  }
  return 0;
}

}  // namespace mixtrain::cli
