#include "runtime/device_books.h"

#include <map>
#include <mutex>

#include "util/format.h"
#include "util/log.h"

namespace kiln::runtime {
namespace {

// A store and the ledger it counts in, kept alive together.
struct StoreHolder {
    std::shared_ptr<DeviceLedger> ledger;
    WeightStore store;
    StoreHolder(std::shared_ptr<DeviceLedger> l, ggml_backend_buffer_type_t buft)
        : ledger(std::move(l)), store(*ledger, buft) {}
};

struct Books {
    std::mutex mutex;
    std::map<std::string, std::weak_ptr<DeviceLedger>> ledgers;
    std::map<std::string, std::weak_ptr<WeightStore>> stores;
};

Books& books() {
    static Books b;
    return b;
}

std::shared_ptr<DeviceLedger> ledger_locked(Books& b, const std::string& name, ggml_backend_dev_t device,
                                            std::optional<double> budget_gib) {
    if (auto existing = b.ledgers[name].lock()) {
        if (budget_gib) {
            DeviceLedger wanted(device, budget_gib);
            if (wanted.budget() != existing->budget()) {
                KILN_LOG_WARN(
                    "%s: another model already uses this device with %s; its books are shared, so that "
                    "budget stays",
                    name.c_str(),
                    existing->budget() ? ("a budget of " + human_bytes(*existing->budget())).c_str() : "no budget");
            }
        }
        return existing;
    }
    auto ledger = std::make_shared<DeviceLedger>(device, budget_gib);
    b.ledgers[name] = ledger;
    return ledger;
}

}  // namespace

std::shared_ptr<DeviceLedger> shared_ledger(const std::string& name, ggml_backend_dev_t device,
                                            std::optional<double> budget_gib) {
    Books& b = books();
    std::lock_guard<std::mutex> lock(b.mutex);
    return ledger_locked(b, name, device, budget_gib);
}

std::shared_ptr<WeightStore> shared_store(const std::string& name, ggml_backend_dev_t device,
                                          std::optional<double> budget_gib, ggml_backend_buffer_type_t buft) {
    Books& b = books();
    std::lock_guard<std::mutex> lock(b.mutex);
    if (auto existing = b.stores[name].lock()) return existing;
    auto holder = std::make_shared<StoreHolder>(ledger_locked(b, name, device, budget_gib), buft);
    std::shared_ptr<WeightStore> store(holder, &holder->store);
    b.stores[name] = store;
    return store;
}

}  // namespace kiln::runtime
