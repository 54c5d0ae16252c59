/* The codecs torchvision's image extension links, each called once so the link is real. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <png.h>
#include <stdio.h>
#include <jpeglib.h>
#include <webp/decode.h>

static PyObject* versions(PyObject* self, PyObject* args) {
  struct jpeg_decompress_struct cinfo;
  struct jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return Py_BuildValue("{s:k,s:i,s:i}", "png", (unsigned long)png_access_version_number(), "jpeg",
                       JPEG_LIB_VERSION, "webp", WebPGetDecoderVersion());
}

static PyMethodDef methods[] = {{"versions", versions, METH_NOARGS, "codec library versions"}, {NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "image", NULL, -1, methods};
PyMODINIT_FUNC PyInit_image(void) { return PyModule_Create(&module); }
