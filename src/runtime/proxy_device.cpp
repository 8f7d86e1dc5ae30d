#include "runtime/proxy_device.h"

#include <algorithm>

#include "ggml-backend-impl.h"  // ggml has no public way to build a device; it is pinned (scripts/ggml.lock)
#include "util/format.h"
#include "util/log.h"

namespace kiln::runtime {
namespace {

// The proxy's device and buffer type, and what they stand for. Every call
// goes to the real device or buffer type; only the rules differ, and a
// backend made from the proxy names the proxy as its device, so that
// ggml_backend_get_default_buffer_type (how ggml's RPC server finds where to
// allocate) returns the proxy's buffer type, and ggml's scheduler asks the
// proxy which ops it takes.
struct ProxyDevice {
    ggml_backend_device device{};
    ggml_backend_buffer_type buffer_type{};
    ggml_backend_dev_t real = nullptr;
    ggml_backend_buffer_type_t real_buffer_type = nullptr;
    ProxyRules rules;
};

ProxyDevice& of(ggml_backend_dev_t dev) { return *static_cast<ProxyDevice*>(dev->context); }
ProxyDevice& of(ggml_backend_buffer_type_t buft) { return *static_cast<ProxyDevice*>(buft->context); }

// The real buffer type for the proxy's, any other unchanged.
ggml_backend_buffer_type_t real_of(ProxyDevice& d, ggml_backend_buffer_type_t buft) {
    return buft == &d.buffer_type ? d.real_buffer_type : buft;
}

ggml_backend_buffer_t alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    ProxyDevice& d = of(buft);
    if (size > d.rules.max_alloc) {
        KILN_LOG_WARN("refused a %s buffer on %s: --max-alloc is %s", human_bytes(size).c_str(),
                      ggml_backend_dev_name(d.real), human_bytes(d.rules.max_alloc).c_str());
        return nullptr;
    }
    // The buffer belongs to the real buffer type: freeing and using it never
    // comes back here.
    return ggml_backend_buft_alloc_buffer(d.real_buffer_type, size);
}

const ggml_backend_buffer_type_i kBufferTypeInterface = {
    /* .get_name = */ [](ggml_backend_buffer_type_t buft) { return ggml_backend_buft_name(of(buft).real_buffer_type); },
    /* .alloc_buffer = */ alloc_buffer,
    /* .get_alignment = */
    [](ggml_backend_buffer_type_t buft) { return ggml_backend_buft_get_alignment(of(buft).real_buffer_type); },
    /* .get_max_size = */
    [](ggml_backend_buffer_type_t buft) {
        return std::min(ggml_backend_buft_get_max_size(of(buft).real_buffer_type), of(buft).rules.max_alloc);
    },
    /* .get_alloc_size = */
    [](ggml_backend_buffer_type_t buft, const ggml_tensor* tensor) {
        return ggml_backend_buft_get_alloc_size(of(buft).real_buffer_type, tensor);
    },
    /* .is_host = */
    [](ggml_backend_buffer_type_t buft) { return ggml_backend_buft_is_host(of(buft).real_buffer_type); },
};

// The device interface: each member forwards to the real device's, and is
// absent where the real one is (ggml treats some as optional).
ggml_backend_device_i device_interface(const ggml_backend_device_i& real) {
    ggml_backend_device_i i{};
    i.get_name = [](ggml_backend_dev_t dev) { return ggml_backend_dev_name(of(dev).real); };
    i.get_description = [](ggml_backend_dev_t dev) { return ggml_backend_dev_description(of(dev).real); };
    i.get_memory = [](ggml_backend_dev_t dev, size_t* free, size_t* total) {
        if (const size_t reported = of(dev).rules.reported_memory) {
            *free = *total = reported;
            return;
        }
        ggml_backend_dev_memory(of(dev).real, free, total);
    };
    i.get_type = [](ggml_backend_dev_t dev) { return ggml_backend_dev_type(of(dev).real); };
    i.get_props = [](ggml_backend_dev_t dev, ggml_backend_dev_props* props) {
        ggml_backend_dev_get_props(of(dev).real, props);
    };
    i.init_backend = [](ggml_backend_dev_t dev, const char* params) {
        ggml_backend_t backend = ggml_backend_dev_init(of(dev).real, params);
        if (backend) backend->device = dev;
        return backend;
    };
    i.get_buffer_type = [](ggml_backend_dev_t dev) { return &of(dev).buffer_type; };
    if (real.get_host_buffer_type) {
        i.get_host_buffer_type = [](ggml_backend_dev_t dev) { return ggml_backend_dev_host_buffer_type(of(dev).real); };
    }
    if (real.buffer_from_host_ptr) {
        i.buffer_from_host_ptr = [](ggml_backend_dev_t dev, void* ptr, size_t size, size_t max_tensor_size) {
            return ggml_backend_dev_buffer_from_host_ptr(of(dev).real, ptr, size, max_tensor_size);
        };
    }
    i.supports_op = [](ggml_backend_dev_t dev, const ggml_tensor* op) {
        const ProxyRules& rules = of(dev).rules;
        if (rules.declines_op && rules.declines_op(op)) return false;
        return ggml_backend_dev_supports_op(of(dev).real, op);
    };
    i.supports_buft = [](ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
        return ggml_backend_dev_supports_buft(of(dev).real, real_of(of(dev), buft));
    };
    if (real.offload_op) {
        i.offload_op = [](ggml_backend_dev_t dev, const ggml_tensor* op) {
            return ggml_backend_dev_offload_op(of(dev).real, op);
        };
    }
    if (real.event_new) {
        i.event_new = [](ggml_backend_dev_t dev) { return ggml_backend_event_new(of(dev).real); };
        // Events made by the real device name it, so ggml frees and waits on
        // them through the real device; these are never called.
        i.event_free = real.event_free;
        i.event_synchronize = real.event_synchronize;
    }
    return i;
}

}  // namespace

ggml_backend_dev_t proxy_device(ggml_backend_dev_t device, const ProxyRules& rules) {
    auto* d = new ProxyDevice;  // lives as long as the process, as ggml's devices do
    d->real = device;
    d->real_buffer_type = ggml_backend_dev_buffer_type(device);
    d->rules = rules;
    d->device.iface = device_interface(device->iface);
    d->device.reg = device->reg;  // so ggml finds the real backend's functions (set_n_threads)
    d->device.context = d;
    d->buffer_type.iface = kBufferTypeInterface;
    d->buffer_type.device = &d->device;
    d->buffer_type.context = d;
    return &d->device;
}

}  // namespace kiln::runtime
