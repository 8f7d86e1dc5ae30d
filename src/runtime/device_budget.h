// `--max-vram` budgets and the per-device ledger of managed memory.
//
// A budget is given in GiB per device (docs/architecture.md, "The memory system"):
//   positive  a managed budget: weights plus the buffers runners register;
//   0         no explicit budget: the live free memory of the device;
//   negative  the free memory at start-up minus that many GiB.
// Live free memory can always lower the limit of a run. The ledger counts
// every managed byte on its device (weights, compute copies, workspaces,
// carried activations) and remembers the peak, so tests can check the
// invariant "managed bytes never exceed the budget" from kiln's own books.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ggml-backend.h"
#include "util/result.h"

namespace kiln::runtime {

// Parsed `--max-vram`: one value for every device, per-device values, or
// both ("4,rpc0=0.5": rpc0 gets 0.5, every other device 4). Values are GiB;
// a unit suffix (K, M, G with optional "iB") gives bytes in that unit
// instead ("96M" = 96 MiB), which small test models need.
struct BudgetSpec {
    std::optional<double> all_gib;
    std::map<std::string, double> per_device_gib;  // keys upper-case device names ("RPC0")

    bool empty() const { return !all_gib && per_device_gib.empty(); }
    // The value for `device` (any case), if one was given.
    std::optional<double> for_device(std::string_view device) const;
    // Every per-device key names one of `devices` (any case); else an error
    // naming the unknown one and the valid ones. Run once the --rpc devices
    // are registered, so that rpc0=... is known.
    Status check_devices(const std::vector<std::string>& devices) const;
};

// "6", "-1.5", "0", "96M", "512MiB", "2G" -> GiB: a number of GiB, or of
// K, M or G with a unit suffix (optionally "B" or "iB").
Result<double> parse_gib_amount(std::string_view text);

// Errors name the flag and the bad part.
Result<BudgetSpec> parse_max_vram(std::string_view spec);

// A size option's bytes ("2G", "512M"; GiB when bare), from 1K to 1e9G;
// an invalid request naming `flag` otherwise.
Result<uint64_t> parse_size_bytes(const std::string& flag, const std::string& spec);

class DeviceLedger {
  public:
    // `budget_gib` as for --max-vram (nullopt: same as 0). The device's free
    // memory is read now for negative budgets.
    DeviceLedger(ggml_backend_dev_t device, std::optional<double> budget_gib);

    const std::string& device_name() const { return name_; }
    ggml_backend_dev_t device() const { return device_; }
    // The explicit managed budget in bytes, if any (positive or negative spec).
    std::optional<uint64_t> budget() const { return budget_; }

    // Any thread may read these while a job changes them (kiln serve's
    // /kiln/v1/memory reads them live): the counters are atomic.
    uint64_t managed() const { return managed_.load(std::memory_order_relaxed); }
    uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }
    void add(uint64_t bytes);
    void release(uint64_t bytes);
    // The most the managed bytes may reach now: the budget, lowered by the
    // device's live free memory (managed + free).
    uint64_t limit() const;
    // Forget the peak (a new job starts).
    void reset_peak() { peak_.store(managed()); }

  private:
    ggml_backend_dev_t device_;
    std::string name_;
    std::optional<uint64_t> budget_;
    std::atomic<uint64_t> managed_{0};
    std::atomic<uint64_t> peak_{0};
};

// Bytes counted on a ledger for as long as the reservation lives: memory
// kiln holds outside the weight stores and workspaces (a job's decoded
// images), so that every run and plan on the device sees it.
class LedgerReservation {
  public:
    LedgerReservation() = default;
    LedgerReservation(LedgerReservation&& other) noexcept { *this = std::move(other); }
    LedgerReservation& operator=(LedgerReservation&& other) noexcept;
    LedgerReservation(const LedgerReservation&) = delete;
    LedgerReservation& operator=(const LedgerReservation&) = delete;
    ~LedgerReservation() { release(); }

    // Counts `bytes` on `ledger` when they fit under its limit; otherwise an
    // out-of-memory error naming `what`, the bytes and what the budget leaves.
    static Result<LedgerReservation> make(DeviceLedger& ledger, uint64_t bytes, const std::string& what);
    uint64_t bytes() const { return bytes_; }
    void release();

  private:
    DeviceLedger* ledger_ = nullptr;
    uint64_t bytes_ = 0;
};

// Free bytes of `device` as it reports them now (for the CPU: MemAvailable).
uint64_t device_free_bytes(ggml_backend_dev_t device);

}  // namespace kiln::runtime
