#include "table.h"

KILN_TABLE_SUM(kiln_sum_a, KILN_ROWS5())
