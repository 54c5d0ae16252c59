#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef KILN_BUILT_AT
#define KILN_BUILT_AT "(not stamped)"
#endif

static PyObject *twice(PyObject *self, PyObject *args) {
  long value;
  if (!PyArg_ParseTuple(args, "l", &value)) return NULL;
  return PyLong_FromLong(2 * value);
}

static PyObject *built_at(PyObject *self, PyObject *args) { return PyUnicode_FromString(KILN_BUILT_AT); }

static PyMethodDef methods[] = {
    {"twice", twice, METH_VARARGS, "2 * value"},
    {"built_at", built_at, METH_NOARGS, "when it was built, if the tree asked for the stamp"},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speed", "torchkiln test module", -1, methods};

PyMODINIT_FUNC PyInit__speed(void) { return PyModule_Create(&module); }
