// libFuzzer target for the checkpoint reader: the same bytes go to the raw
// unpickler and to parse_ckpt (zip reader + unpickler + state dict walk).
// Any input must give a value or an error: no crash, no leak, no undefined
// behaviour, no unbounded allocation. Seeds: tests/fuzz/corpus/pickle/.
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Isrc -Ithird_party/ggml/include \
//       tests/fuzz/fuzz_pickle.cpp src/io/{pickle,zip_reader,ckpt,dtype,tensor_info}.cpp -lggml-base ...
//   ./fuzz_pickle tests/fuzz/corpus/pickle
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "io/ckpt.h"
#include "io/pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto doc = kiln::io::unpickle(data, size);
    if (doc.ok()) {
        // Touch what a consumer would: the root and every value's elements.
        for (const auto& v : doc.value().values) {
            for (const auto* item : v->items) {
                if (item == nullptr) std::abort();
            }
            for (const auto& [key, value] : v->entries) {
                if (key == nullptr || value == nullptr) std::abort();
            }
        }
        if (doc.value().root == nullptr) std::abort();
    }

    auto parsed = kiln::io::parse_ckpt(data, size, "fuzz.ckpt");
    if (parsed.ok()) {
        for (const auto& t : parsed.value().tensors) {
            // Every reported tensor must lie inside the input.
            if (t.offset > size || t.nbytes > size - t.offset) std::abort();
        }
    }
    return 0;
}
