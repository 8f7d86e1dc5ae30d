// The books of every device, shared by all the models of the process
// (docs/architecture.md, "The memory system": a budget and its books belong to the device). Two contexts on
// one GPU under --max-vram 6 share one ledger of those 6 GiB and one weight
// store, so each sees the other's weights and workspaces when it makes room.
//
// The first model to use a device sets its budget; a later model asking for
// another budget gets the existing one and a warning. Books live while any
// model holds them. Ledgers and stores are not thread-safe: jobs on one
// device run one at a time (a context is used by one thread at a time, and a
// server runs its jobs in turn).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ggml-backend.h"
#include "runtime/device_budget.h"
#include "runtime/weight_store.h"

namespace kiln::runtime {

// The ledger of device `name` (`device` null for the CPU), made with
// `budget_gib` if no model holds one yet.
std::shared_ptr<DeviceLedger> shared_ledger(const std::string& name, ggml_backend_dev_t device,
                                            std::optional<double> budget_gib);

// The weight store of device `name`, counting in shared_ledger(name, ...)'s
// ledger and allocating compute copies in `buft`.
std::shared_ptr<WeightStore> shared_store(const std::string& name, ggml_backend_dev_t device,
                                          std::optional<double> budget_gib, ggml_backend_buffer_type_t buft);

}  // namespace kiln::runtime
