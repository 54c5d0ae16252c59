// Tables of 100000-int rows (each int 7), spelled with macros so the files stay small: cc1plus holds every
// element of an initializer, about 160 MB at its peak for the 5 rows of KILN_ROWS5() (gcc 12.2, -O1).
#pragma once

#define KILN_E1() 7,
#define KILN_E10() KILN_E1() KILN_E1() KILN_E1() KILN_E1() KILN_E1() KILN_E1() KILN_E1() KILN_E1() KILN_E1() KILN_E1()
#define KILN_E100() KILN_E10() KILN_E10() KILN_E10() KILN_E10() KILN_E10() KILN_E10() KILN_E10() KILN_E10() KILN_E10() KILN_E10()
#define KILN_E1K() KILN_E100() KILN_E100() KILN_E100() KILN_E100() KILN_E100() KILN_E100() KILN_E100() KILN_E100() KILN_E100() KILN_E100()
#define KILN_E10K() KILN_E1K() KILN_E1K() KILN_E1K() KILN_E1K() KILN_E1K() KILN_E1K() KILN_E1K() KILN_E1K() KILN_E1K() KILN_E1K()
#define KILN_ROW() KILN_E10K() KILN_E10K() KILN_E10K() KILN_E10K() KILN_E10K() KILN_E10K() KILN_E10K() KILN_E10K() KILN_E10K() KILN_E10K()
#define KILN_ROWS5() KILN_ROW() KILN_ROW() KILN_ROW() KILN_ROW() KILN_ROW()

// The sum of a table, computed at run time from what the compiler emitted.
#define KILN_TABLE_SUM(name, ...)                        \
  static const int name##_table[] = {__VA_ARGS__ 0};    \
  long name() {                                          \
    long sum = 0;                                        \
    for (int value : name##_table) sum += value;         \
    return sum;                                          \
  }
