/* torch._C of the stand-in: the Python side, linking lib/libtorch_cpu.so as torch/_C links libtorch_python.so
   and through it libtorch_cpu.so (RUNPATH $ORIGIN/lib). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

int kiln_omp_threads(int wanted);
long kiln_omp_sum(long n);

static PyObject *parallel(PyObject *self, PyObject *args) {
    int wanted = 0;
    long n = 0;
    if (!PyArg_ParseTuple(args, "il", &wanted, &n)) return NULL;
    return Py_BuildValue("(il)", kiln_omp_threads(wanted), kiln_omp_sum(n));
}

static PyMethodDef methods[] = {{"parallel", parallel, METH_VARARGS, "threads run, and 1+...+n in parallel"}, {0}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
