#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "core.h"

// Plain C++ (no Python.h): the same object for every Python.
std::uint64_t kiln_core_4() {
  std::map<std::string, std::vector<std::uint64_t>> table;
  for (std::uint64_t k = 0; k < 100; ++k) table[std::to_string(k * 7)].push_back(k + 4);
  std::uint64_t sum = 0;
  for (const auto& [key, values] : table) sum += key.size() + std::accumulate(values.begin(), values.end(), 0ull);
  return sum;
}
