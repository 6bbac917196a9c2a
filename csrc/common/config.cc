#include "common/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "common/error.h"

namespace smddp {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) {
    return "";
  }
  size_t e = s.find_last_not_of(" \t\n");
  return s.substr(b, e - b + 1);
}

// Domain "lo..hi" of an int or bytes knob.
void parseRange(const std::string& domain, long double* lo, long double* hi) {
  size_t dots = domain.find("..");
  SMDDP_ASSERT(dots != std::string::npos, "bad knob domain ", domain);
  *lo = static_cast<long double>(parseBytes("domain", domain.substr(0, dots)));
  *hi = static_cast<long double>(parseBytes("domain", domain.substr(dots + 2)));
}

void checkRange(
    const char* name,
    const std::string& value,
    const std::string& domain,
    long double x) {
  long double lo = 0, hi = 0;
  parseRange(domain, &lo, &hi);
  if (x < lo || x > hi) {
    SMDDP_THROW(
        kConfig,
        name,
        "='",
        value,
        "' is out of range; use ",
        domain,
        " (or unset it for the default)");
  }
}

std::string parseChoiceValue(
    const char* name,
    const std::string& value,
    const std::string& choices) {
  std::string v = lower(trim(value));
  size_t start = 0;
  while (true) {
    size_t bar = choices.find('|', start);
    std::string c = choices.substr(
        start, bar == std::string::npos ? std::string::npos : bar - start);
    if (c == v) {
      return v;
    }
    if (bar == std::string::npos) {
      break;
    }
    start = bar + 1;
  }
  SMDDP_THROW(
      kConfig,
      name,
      "='",
      value,
      "' is not valid; use one of ",
      choices,
      " (or unset it for the default)");
}

// One parser per kind; the field type picks the overload.
void parse_choice(
    Algo* out,
    const char* name,
    const std::string& v,
    const std::string& d) {
  std::string c = parseChoiceValue(name, v, d);
  *out = c == "ring" ? Algo::kRing
      : c == "hierarchical" ? Algo::kHierarchical
                            : Algo::kAuto;
}

void parse_choice(
    Tristate* out,
    const char* name,
    const std::string& v,
    const std::string& d) {
  std::string c = parseChoiceValue(name, v, d);
  *out = c == "on" ? Tristate::kOn : c == "off" ? Tristate::kOff : Tristate::kAuto;
}

void parse_choice(
    HugePageMode* out,
    const char* name,
    const std::string& v,
    const std::string& d) {
  std::string c = parseChoiceValue(name, v, d);
  *out = c == "advise" ? HugePageMode::kAdvise : c == "off" ? HugePageMode::kOff : HugePageMode::kAuto;
}

void parse_choice(
    std::string* out,
    const char* name,
    const std::string& v,
    const std::string& d) {
  *out = parseChoiceValue(name, v, d);
}

void parse_bytes(
    size_t* out,
    const char* name,
    const std::string& v,
    const std::string& d) {
  *out = parseBytes(name, v);
  checkRange(name, v, d, static_cast<long double>(*out));
}

void parse_int(
    int* out,
    const char* name,
    const std::string& v,
    const std::string& d) {
  std::string t = trim(v);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(t.c_str(), &end, 10);
  if (t.empty() || errno != 0 || *end != '\0') {
    SMDDP_THROW(
        kConfig, name, "='", v, "' is not an integer; use ", d, " or unset it");
  }
  checkRange(name, v, d, static_cast<long double>(x));
  *out = static_cast<int>(x);
}

void parse_autobytes(
    size_t* out,
    const char* name,
    const std::string& v,
    const std::string& d) {
  if (lower(trim(v)) == "auto") {
    *out = kAutoBytes;
    return;
  }
  parse_bytes(out, name, v, d);
}

void parse_autoint(
    int* out,
    const char* name,
    const std::string& v,
    const std::string& d) {
  if (lower(trim(v)) == "auto") {
    *out = -1;
    return;
  }
  std::string t = trim(v);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(t.c_str(), &end, 10);
  if (t.empty() || errno != 0 || *end != '\0') {
    SMDDP_THROW(kConfig, name, "='", v, "' is neither auto nor an integer; use auto or ", d,
                " or unset it");
  }
  checkRange(name, v, d, static_cast<long double>(x));
  *out = static_cast<int>(x);
}

void parse_bool(
    bool* out,
    const char* name,
    const std::string& v,
    const std::string& /*domain*/) {
  std::string t = lower(trim(v));
  if (t == "1" || t == "true" || t == "on" || t == "yes") {
    *out = true;
  } else if (t == "0" || t == "false" || t == "off" || t == "no") {
    *out = false;
  } else {
    SMDDP_THROW(kConfig, name, "='", v, "' is not a boolean; use 1 or 0");
  }
}

void parse_string(
    std::string* out,
    const char* /*name*/,
    const std::string& v,
    const std::string& /*domain*/) {
  *out = trim(v);
}

} // namespace

size_t parseBytes(const std::string& name, const std::string& value) {
  std::string v = trim(value);
  unsigned long long mult = 1;
  if (!v.empty()) {
    char s = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
    if (s == 'B' && v.size() > 1) {
      v.pop_back();
      s = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
    }
    if (s == 'K' || s == 'M' || s == 'G' || s == 'T') {
      int shift = s == 'K' ? 10 : s == 'M' ? 20 : s == 'G' ? 30 : 40;
      mult = 1ull << shift;
      v.pop_back();
    }
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || errno != 0 || *end != '\0' ||
      x > std::numeric_limits<size_t>::max() / mult) {
    SMDDP_THROW(
        kConfig,
        name,
        "='",
        value,
        "' is not a byte count; use e.g. 65536, 64K, 1M or 1G");
  }
  return static_cast<size_t>(x * mult);
}

namespace {

// SMDDP_SOCKET_IFNAME's entries, trimmed and checked for form (whether the
// host has them is checked where the sockets are made).
std::string interfaceList(const std::string& value) {
  if (value.empty()) {
    return value;
  }
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t comma = value.find(',', start);
    const std::string e =
        trim(value.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    unsigned char probe[sizeof(struct in6_addr)];
    const bool address = ::inet_pton(AF_INET, e.c_str(), probe) == 1 || ::inet_pton(AF_INET6, e.c_str(), probe) == 1;
    // An interface name: at most IFNAMSIZ - 1 characters, none of them
    // blank or a slash.
    const bool name = !e.empty() && e.size() < 16 &&
        std::none_of(e.begin(), e.end(), [](char ch) { return ch == '/' || std::isspace(static_cast<unsigned char>(ch)); });
    if (!address && !name) {
      SMDDP_THROW(
          kConfig, "SMDDP_SOCKET_IFNAME='", value, "': ", e.empty() ? std::string("an entry is empty") : str("'", e, "' is neither an interface name nor an address"),
          "; list interface names or addresses separated by commas, e.g. eth0,eth1");
    }
    out += (out.empty() ? "" : ",") + e;
    if (comma == std::string::npos) {
      return out;
    }
    start = comma + 1;
  }
}

// SMDDP_SOCKET_PORTS: "LOW-HIGH", 1 <= LOW <= HIGH <= 65535.
void portRange(const std::string& value, int* low, int* high) {
  *low = *high = 0;
  if (value.empty()) {
    return;
  }
  auto bad = [&](const std::string& why) {
    SMDDP_THROW(kConfig, "SMDDP_SOCKET_PORTS='", value, "': ", why,
                "; give a range of TCP ports the hosts admit between them, e.g. 29600-29663");
  };
  const size_t dash = value.find('-');
  if (dash == std::string::npos) {
    bad("not LOW-HIGH");
  }
  auto port = [&](const std::string& part) {
    const std::string t = trim(part);
    if (t.empty() || t.size() > 5 || !std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      bad(str("'", t, "' is not a port number"));
    }
    const int p = std::stoi(t);
    if (p < 1 || p > 65535) {
      bad(str(p, " is not a port number (1..65535)"));
    }
    return p;
  };
  *low = port(value.substr(0, dash));
  *high = port(value.substr(dash + 1));
  if (*low > *high) {
    bad("LOW is above HIGH");
  }
}

} // namespace

Config Config::fromEnv(const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name, const char* def) -> std::string {
    const char* v = getenv ? getenv(name) : std::getenv(name);
    return (v != nullptr && *v != '\0') ? std::string(v) : std::string(def);
  };
  Config c;
#define SMDDP_PARSE_KNOB(field, env, agree, kind, def, domain, help) \
  parse_##kind(&c.field, env, get(env, def), domain);
  SMDDP_CONFIG_KNOBS(SMDDP_PARSE_KNOB)
#undef SMDDP_PARSE_KNOB
  c.socket_ifname = interfaceList(c.socket_ifname);
  portRange(c.socket_ports, &c.socket_port_low, &c.socket_port_high);
  if (c.shm_slot_bytes % 64 != 0) {
    SMDDP_THROW(
        kConfig,
        "SMDDP_SHM_SLOT_BYTES=",
        c.shm_slot_bytes,
        " is not a multiple of 64 (a cache line)");
  }
  return c;
}

namespace {

std::string canonical(Algo a) {
  return a == Algo::kRing ? "ring" : a == Algo::kHierarchical ? "hierarchical" : "auto";
}
std::string canonical(Tristate t) {
  return t == Tristate::kOn ? "on" : t == Tristate::kOff ? "off" : "auto";
}
std::string canonical(HugePageMode m) {
  return m == HugePageMode::kAdvise ? "advise" : m == HugePageMode::kOff ? "off" : "auto";
}
std::string canonical(const std::string& s) {
  return s;
}
std::string canonical(bool b) {
  return b ? "1" : "0";
}
std::string canonical(size_t x) {
  return std::to_string(x);
}
std::string canonical(int x) {
  return std::to_string(x);
}

std::vector<std::pair<std::string, std::string>> splitAgreement(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t semi = s.find(';', start);
    std::string item = s.substr(start, semi == std::string::npos ? std::string::npos : semi - start);
    size_t eq = item.find('=');
    out.emplace_back(item.substr(0, eq), eq == std::string::npos ? "" : item.substr(eq + 1));
    if (semi == std::string::npos) {
      break;
    }
    start = semi + 1;
  }
  return out;
}

} // namespace

std::string Config::agreementString() const {
  std::string out;
#define SMDDP_AGREE_KNOB(field, env, agree, kind, def, domain, help) \
  if (agree) {                                                       \
    out += str(out.empty() ? "" : ";", env, "=", canonical(field));  \
  }
  SMDDP_CONFIG_KNOBS(SMDDP_AGREE_KNOB)
#undef SMDDP_AGREE_KNOB
  return out;
}

std::string Config::describeDifference(const std::string& a, const std::string& b) {
  auto xa = splitAgreement(a);
  auto xb = splitAgreement(b);
  if (xa.size() != xb.size()) {
    return "the two ranks run different versions of smddp";
  }
  std::string out;
  for (size_t i = 0; i < xa.size(); ++i) {
    if (xa[i] != xb[i]) {
      out += str(out.empty() ? "" : "; ", xa[i].first, " is '", xa[i].second,
                 "' on one and '", xb[i].second, "' on the other");
    }
  }
  return out;
}

namespace {

// "32K", "1M": a size as the knobs write it.
std::string sizeText(size_t bytes) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return str(bytes, units[u]);
}

// A help text with {kName} replaced by the value of autos::kName.
std::string interpolate(const std::string& help) {
  static const std::pair<const char*, std::string> kValues[] = {
      {"kSingleCopyMinBytes", sizeText(autos::kSingleCopyMinBytes)},
      {"kSingleCopyMinBytesOversubscribed", sizeText(autos::kSingleCopyMinBytesOversubscribed)},
      {"kAllReduceSingleCopyMinBytes", sizeText(autos::kAllReduceSingleCopyMinBytes)},
      {"kSequentialRailBytes", sizeText(autos::kSequentialRailBytes)},
      {"kMinRailChunkBytes", sizeText(autos::kMinRailChunkBytes)},
      {"kSocketRcvbufBytes", sizeText(autos::kSocketRcvbufBytes)},
      {"kSpinUs", std::to_string(autos::kSpinUs)},
      {"kSpinUsOversubscribed", std::to_string(autos::kSpinUsOversubscribed)},
      {"kYieldUs", std::to_string(autos::kYieldUs)},
      {"kYieldUsOversubscribed", std::to_string(autos::kYieldUsOversubscribed)},
  };
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t open = help.find('{', at);
    if (open == std::string::npos) {
      return out + help.substr(at);
    }
    const size_t close = help.find('}', open);
    SMDDP_ASSERT(close != std::string::npos, "unclosed {} in a knob's help: ", help);
    const std::string name = help.substr(open + 1, close - open - 1);
    const std::string* value = nullptr;
    for (const auto& [n, v] : kValues) {
      if (name == n) {
        value = &v;
      }
    }
    SMDDP_ASSERT(value != nullptr, "a knob's help names no constant '", name, "'");
    out += help.substr(at, open - at) + *value;
    at = close + 1;
  }
}

} // namespace

std::vector<KnobInfo> describeKnobs() {
  std::vector<KnobInfo> out;
#define SMDDP_DESCRIBE_KNOB(field, env, agree, kind, def, domain, help) \
  out.push_back(KnobInfo{env, agree, #kind, def, domain, interpolate(help)});
  SMDDP_CONFIG_KNOBS(SMDDP_DESCRIBE_KNOB)
#undef SMDDP_DESCRIBE_KNOB
  return out;
}

void Config::failAgreement(Store& store, const std::string& key, int rank, const std::string& failure) {
  // Only published: the failed rank raises its own error without waiting.
  storeAllGatherFailed(store, key, rank, failure);
}

void Config::checkAgreement(Store& store, const std::string& key, int rank, int size,
                            const std::function<std::string(int)>& name_of) const {
  auto settings = storeAllGather(store, key, rank, size, toBytes(agreementString()), ErrorKind::kConfig, name_of);
  for (int r = 0; r < size; ++r) {
    const std::string diff = describeDifference(toString(settings[0]), toString(settings[static_cast<size_t>(r)]));
    if (!diff.empty()) {
      SMDDP_THROW(kConfig, "ranks 0 and ", r, " have different settings: ", diff,
                  ". Set the SMDDP_* variables the same way on every rank.");
    }
  }
}

} // namespace smddp
