#include <stdio.h>

#include "feature.h"

int main(void) {
  printf("USE_KILN_FEATURE=%d KILN_ARCH_LIST=%s\n", USE_KILN_FEATURE, KILN_ARCH_LIST);
  return 0;
}
