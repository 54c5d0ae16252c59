#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *built_at(PyObject *self, PyObject *args) { return PyUnicode_FromString(KILN_BUILT_AT); }

static PyMethodDef methods[] = {{"built_at", built_at, METH_NOARGS, "when it was built"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stamp", "torchkiln test module", -1, methods};

PyMODINIT_FUNC PyInit__stamp(void) { return PyModule_Create(&module); }
