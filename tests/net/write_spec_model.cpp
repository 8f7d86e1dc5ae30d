// Writes the random-weight model a tensor spec describes (tests/fixtures/
// *.spec), as the unit tests do (tests/unit/random_model.h), for the shell
// tests under tests/net, which need one without Python.
#include <cstdio>

#include "random_model.h"

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s SPEC OUT.safetensors\n", argv[0]);
        return 2;
    }
    const kiln::Status written = kiln::test::write_random_model(argv[1], argv[2]);
    if (!written.ok()) {
        std::fprintf(stderr, "error: %s\n", written.error().message.c_str());
        return 1;
    }
    return 0;
}
