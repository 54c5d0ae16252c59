#include <Python.h>

long kiln_sum_a();
long kiln_sum_b();

static PyObject* table_sums(PyObject*, PyObject*) {
  return Py_BuildValue("(ll)", kiln_sum_a(), kiln_sum_b());
}

static PyMethodDef methods[] = {
    {"table_sums", table_sums, METH_NOARGS, "the sums of the two compiled tables"},
    {nullptr, nullptr, 0, nullptr},
};

static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module); }
