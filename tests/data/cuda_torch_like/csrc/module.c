/* torchlike._C: the Python side, linking libtorchlike_cuda.so as torch/_C links libtorch_cuda.so. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

int torchlike_cuda_versions(int *runtime, int *cublas_major, int *cublas_minor);

static PyObject *versions(PyObject *self, PyObject *args) {
    int runtime = 0, major = 0, minor = 0;
    int failed = torchlike_cuda_versions(&runtime, &major, &minor);
    if (failed) return PyErr_Format(PyExc_RuntimeError, "CUDA version query %d failed", failed);
    return Py_BuildValue("(iii)", runtime, major, minor);
}

static PyMethodDef methods[] = {{"versions", versions, METH_NOARGS, "CUDA runtime and cuBLAS versions"}, {0}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
