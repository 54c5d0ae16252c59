#pragma once
#include <cstdint>

// One checksum per core unit; the module adds them up.
std::uint64_t kiln_core_0();
std::uint64_t kiln_core_1();
std::uint64_t kiln_core_2();
std::uint64_t kiln_core_3();
std::uint64_t kiln_core_4();
std::uint64_t kiln_core_5();
