#include "table.h"

KILN_TABLE_SUM(kiln_sum_b, KILN_ROWS5())
