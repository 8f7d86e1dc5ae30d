#include "runtime/device_budget.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "runtime/host_memory.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::runtime {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string upper(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
}

}  // namespace

Result<double> parse_gib_amount(std::string_view text) {
    const std::string s(trim(text));
    if (s.empty()) return Error{"an empty value"};
    char* end = nullptr;
    const double value = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || !std::isfinite(value)) return Error{"'" + s + "' is not a number of GiB"};
    std::string unit = upper(trim(std::string_view(end)));
    if (unit.size() == 3 && unit.substr(1) == "IB") unit.resize(1);
    if (unit.size() == 2 && unit[1] == 'B') unit.resize(1);
    if (unit.empty() || unit == "G") return value;
    if (unit == "M") return value / 1024.0;
    if (unit == "K") return value / (1024.0 * 1024.0);
    return Error{"'" + s + "' has an unknown unit (use GiB numbers, or K, M, G)"};
}

std::optional<double> BudgetSpec::for_device(std::string_view device) const {
    auto it = per_device_gib.find(upper(device));
    if (it != per_device_gib.end()) return it->second;
    return all_gib;
}

Status BudgetSpec::check_devices(const std::vector<std::string>& devices) const {
    for (const auto& [name, gib] : per_device_gib) {
        bool known = false;
        for (const std::string& d : devices) known = known || upper(d) == name;
        if (!known) {
            std::string valid;
            for (const std::string& d : devices) valid += (valid.empty() ? "" : ", ") + d;
            return Error::invalid_request("--max-vram: unknown device '" + name + "' (valid: " + valid + ")");
        }
    }
    return Status::Ok();
}

namespace {

// A budget of more than this many GiB (about an exbibyte) is no budget any
// device has, and its bytes would overflow 64 bits from 2^34 GiB on: the
// value is refused rather than wrapped (to 0 B) or quietly saturated.
constexpr double kMaxBudgetGib = 1e9;

// One --max-vram value: a number of GiB (or K/M/G), within +-kMaxBudgetGib.
Result<double> budget_gib(std::string_view text) {
    auto v = parse_gib_amount(text);
    if (!v.ok()) return v.error();
    if (std::fabs(*v) > kMaxBudgetGib) {
        return Error{"'" + std::string(trim(text)) + "' is " + (*v > 0 ? "over " : "below -") +
                     "1e9 GiB; a positive budget is GiB the device may hold, a negative one the GiB its free "
                     "memory at start-up keeps back"};
    }
    return *v;
}

}  // namespace

Result<BudgetSpec> parse_max_vram(std::string_view spec) {
    BudgetSpec out;
    if (trim(spec).empty()) return Error{"--max-vram: an empty budget"};
    size_t start = 0;
    while (start <= spec.size()) {
        const size_t comma = std::min(spec.find(',', start), spec.size());
        const std::string_view part = trim(spec.substr(start, comma - start));
        start = comma + 1;
        if (part.empty()) return Error{"--max-vram: an empty entry in '" + std::string(spec) + "'"};
        const size_t eq = part.find('=');
        if (eq == std::string_view::npos) {
            if (out.all_gib) return Error{"--max-vram: two budgets for every device in '" + std::string(spec) + "'"};
            auto v = budget_gib(part);
            if (!v.ok()) return Error::invalid_request("--max-vram: " + v.error().message);
            out.all_gib = *v;
        } else {
            const std::string device = upper(trim(part.substr(0, eq)));
            if (device.empty()) return Error{"--max-vram: '" + std::string(part) + "' names no device"};
            auto v = budget_gib(part.substr(eq + 1));
            if (!v.ok()) return Error::invalid_request("--max-vram: " + device + ": " + v.error().message);
            if (!out.per_device_gib.emplace(device, *v).second) {
                return Error{"--max-vram: two budgets for " + device};
            }
        }
        if (comma == spec.size()) break;
    }
    return out;
}

Result<uint64_t> parse_size_bytes(const std::string& flag, const std::string& spec) {
    auto gib = parse_gib_amount(spec);
    if (!gib.ok()) return Error::invalid_request(flag + ": " + gib.error().message);
    const double bytes = *gib * kGiB;
    if (!(bytes >= 1024.0) || bytes > 1e18) {
        return Error::invalid_request(flag + ": expected a size from 1K to 1e9G, got '" + spec + "'");
    }
    return static_cast<uint64_t>(bytes);
}

uint64_t device_free_bytes(ggml_backend_dev_t device) {
    if (!device || ggml_backend_dev_type(device) == GGML_BACKEND_DEVICE_TYPE_CPU) return host_available_bytes();
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(device, &free, &total);
    return free;
}

DeviceLedger::DeviceLedger(ggml_backend_dev_t device, std::optional<double> budget_gib)
    : device_(device), name_(device ? ggml_backend_dev_name(device) : "CPU") {
    if (!budget_gib || *budget_gib == 0.0) return;
    if (*budget_gib > 0) {
        budget_ = static_cast<uint64_t>(*budget_gib * kGiB);
        return;
    }
    const double free = static_cast<double>(device_free_bytes(device));
    budget_ = static_cast<uint64_t>(std::max(0.0, free + *budget_gib * kGiB));
}

void DeviceLedger::add(uint64_t bytes) {
    const uint64_t now = managed_.fetch_add(bytes) + bytes;
    uint64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
}

void DeviceLedger::release(uint64_t bytes) {
    uint64_t held = managed_.load();
    while (!managed_.compare_exchange_weak(held, held - std::min(bytes, held))) {
    }
}

uint64_t DeviceLedger::limit() const {
    const uint64_t live = managed() + device_free_bytes(device_);
    return budget_ ? std::min(*budget_, live) : live;
}

LedgerReservation& LedgerReservation::operator=(LedgerReservation&& other) noexcept {
    if (this != &other) {
        release();
        ledger_ = other.ledger_;
        bytes_ = other.bytes_;
        other.ledger_ = nullptr;
        other.bytes_ = 0;
    }
    return *this;
}

Result<LedgerReservation> LedgerReservation::make(DeviceLedger& ledger, uint64_t bytes, const std::string& what) {
    const uint64_t limit = ledger.limit();
    const uint64_t room = limit > ledger.managed() ? limit - ledger.managed() : 0;
    if (bytes > room) {
        return Error::out_of_memory("out of memory: " + what + ": " + human_bytes(bytes) + " on " +
                                    ledger.device_name() + ", but the budget leaves " + human_bytes(room));
    }
    LedgerReservation out;
    out.ledger_ = &ledger;
    out.bytes_ = bytes;
    ledger.add(bytes);
    return out;
}

void LedgerReservation::release() {
    if (ledger_) ledger_->release(bytes_);
    ledger_ = nullptr;
    bytes_ = 0;
}

}  // namespace kiln::runtime
