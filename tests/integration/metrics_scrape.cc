#include "tests/integration/metrics_scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvtrim::testing {

absl::StatusOr<std::string> HttpGet(const std::string& host, int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", host));
  }
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect ", host, ":", port, ": ", error));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, ":", port, "\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, 0);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[8192];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n == 0) break;
    if (n < 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::InternalError(absl::StrCat("malformed HTTP response: ", response.substr(0, 200)));
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (status_line.find(" 200") == std::string::npos) {
    return absl::InternalError(absl::StrCat("GET ", path, ": ", status_line));
  }
  return response.substr(header_end + 4);
}

absl::StatusOr<std::vector<Sample>> ParseExposition(const std::string& text) {
  std::vector<Sample> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    Sample sample;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("no value: ", line));
    }
    absl::string_view value = line.substr(space + 1);
    absl::string_view series = line.substr(0, space);
    // A trailing timestamp is not used by prometheus-cpp; a second space would mean one.
    if (brace != absl::string_view::npos && brace < space) {
      const size_t close = series.rfind('}');
      if (close == absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("unclosed labels: ", line));
      }
      sample.name = std::string(series.substr(0, brace));
      absl::string_view labels = series.substr(brace + 1, close - brace - 1);
      // Label values here never contain '"' or ','; split on the `",` separators.
      for (absl::string_view pair : absl::StrSplit(labels, "\",", absl::SkipEmpty())) {
        const size_t eq = pair.find("=\"");
        if (eq == absl::string_view::npos) {
          return absl::InvalidArgumentError(absl::StrCat("bad label in: ", line));
        }
        absl::string_view v = pair.substr(eq + 2);
        absl::ConsumeSuffix(&v, "\"");
        sample.labels[std::string(absl::StripLeadingAsciiWhitespace(pair.substr(0, eq)))] =
            std::string(v);
      }
    } else {
      sample.name = std::string(series);
    }
    if (value == "+Inf") {
      sample.value = HUGE_VAL;
    } else if (value == "-Inf") {
      sample.value = -HUGE_VAL;
    } else if (!absl::SimpleAtod(value, &sample.value)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value: ", line));
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

namespace {

bool Matches(const Sample& sample, const std::string& name,
             const std::map<std::string, std::string>& labels) {
  if (sample.name != name) return false;
  for (const auto& [key, value] : labels) {
    auto it = sample.labels.find(key);
    if (it == sample.labels.end() || it->second != value) return false;
  }
  return true;
}

}  // namespace

int MetricsSnapshot::Count(const std::string& name,
                           const std::map<std::string, std::string>& labels) const {
  int count = 0;
  for (const Sample& sample : samples_) count += Matches(sample, name, labels) ? 1 : 0;
  return count;
}

double MetricsSnapshot::Sum(const std::string& name,
                            const std::map<std::string, std::string>& labels) const {
  double sum = 0;
  for (const Sample& sample : samples_) {
    if (Matches(sample, name, labels)) sum += sample.value;
  }
  return sum;
}

}  // namespace kvtrim::testing
