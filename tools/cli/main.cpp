#include "cli.h"

int main(int argc, char** argv) { return kiln::cli::run_cli(std::vector<std::string>(argv + 1, argv + argc)); }
