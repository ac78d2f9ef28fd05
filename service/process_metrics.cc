#include "service/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kvtrim::service {
namespace {

/// The fields of /proc/self/stat after the command name (field 3, the state, is [0]).
std::optional<std::vector<std::string>> StatFields() {
  std::ifstream file("/proc/self/stat");
  std::string line;
  if (!std::getline(file, line)) return std::nullopt;
  const size_t name_end = line.rfind(')');  // the name may hold spaces and parentheses
  if (name_end == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(name_end + 1));
  std::vector<std::string> fields;
  for (std::string field; rest >> field;) fields.push_back(field);
  if (fields.size() < 22) return std::nullopt;
  return fields;
}

/// The boot time in seconds since the epoch (/proc/stat "btime"), or nullopt.
std::optional<double> BootTimeSeconds() {
  std::ifstream file("/proc/stat");
  for (std::string key; file >> key;) {
    if (key == "btime") {
      double seconds = 0;
      if (file >> seconds) return seconds;
      return std::nullopt;
    }
    file.ignore(1 << 20, '\n');
  }
  return std::nullopt;
}

/// One family of a single unlabelled sample.
prometheus::MetricFamily Single(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

}  // namespace

std::optional<ProcessFigures> ReadProcessFigures() {
  const auto fields = StatFields();
  const auto boot = BootTimeSeconds();
  if (!fields.has_value() || !boot.has_value()) return std::nullopt;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // man 5 proc: utime (14), stime (15), starttime (22), vsize (23), rss (24); fields[0] is
  // field 3.
  const auto at = [&fields](int number) {
    return std::strtod((*fields)[number - 3].c_str(), nullptr);
  };
  ProcessFigures figures;
  figures.cpu_seconds = (at(14) + at(15)) / ticks;
  figures.start_time_seconds = *boot + at(22) / ticks;
  figures.virtual_bytes = at(23);
  figures.resident_bytes = at(24) * page;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++figures.open_fds;
  }
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    figures.max_fds = files.rlim_cur == RLIM_INFINITY ? -1 : static_cast<double>(files.rlim_cur);
  }
  return figures;
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  const std::optional<ProcessFigures> figures = ReadProcessFigures();
  if (!figures.has_value()) return {};
  using prometheus::MetricType;
  return {
      Single("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
             MetricType::Counter, figures->cpu_seconds),
      Single("process_resident_memory_bytes", "Resident memory size in bytes.",
             MetricType::Gauge, figures->resident_bytes),
      Single("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
             figures->virtual_bytes),
      Single("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
             figures->open_fds),
      Single("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
             figures->max_fds),
      Single("process_start_time_seconds",
             "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
             figures->start_time_seconds),
  };
}

}  // namespace kvtrim::service
