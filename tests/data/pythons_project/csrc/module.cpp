#include <Python.h>

#include "core.h"

static PyObject* checksum(PyObject*, PyObject*) {
  return PyLong_FromUnsignedLongLong(kiln_core_0() + kiln_core_1() + kiln_core_2() + kiln_core_3() + kiln_core_4() +
                                     kiln_core_5());
}

// The Python the module was compiled for (PY_MINOR_VERSION of the headers it included).
static PyObject* python(PyObject*, PyObject*) { return Py_BuildValue("(ii)", PY_MAJOR_VERSION, PY_MINOR_VERSION); }

static PyMethodDef methods[] = {
    {"checksum", checksum, METH_NOARGS, "the sum of the core units' checksums"},
    {"python", python, METH_NOARGS, "the Python the module was compiled for"},
    {nullptr, nullptr, 0, nullptr},
};

static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module); }
