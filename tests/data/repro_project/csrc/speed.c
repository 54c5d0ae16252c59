#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *twice(PyObject *self, PyObject *args) {
  long value;
  if (!PyArg_ParseTuple(args, "l", &value)) return NULL;
  return PyLong_FromLong(2 * value);
}

static PyMethodDef methods[] = {{"twice", twice, METH_VARARGS, "2 * value"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speed", "torchkiln test module", -1, methods};

PyMODINIT_FUNC PyInit__speed(void) { return PyModule_Create(&module); }
