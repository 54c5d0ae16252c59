// The extension module: plain CPython C API (torchvision's _C registers ops instead).
#include <Python.h>

static PyObject* kiln_units(PyObject*, PyObject*) { return PyLong_FromLong(13); }

static PyMethodDef kiln_methods[] = {
    {"units", kiln_units, METH_NOARGS, "translation units compiled into this extension"},
    {nullptr, nullptr, 0, nullptr}};

static PyModuleDef kiln_module = {PyModuleDef_HEAD_INIT, "image", nullptr, -1, kiln_methods};

PyMODINIT_FUNC PyInit_image(void) { return PyModule_Create(&kiln_module); }
