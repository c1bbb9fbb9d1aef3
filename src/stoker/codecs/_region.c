/* One rectangle of a JPEG, decoded with libjpeg-turbo doing as little as it can:
 * the rows above the rectangle are skipped (jpeg_skip_scanlines: entropy-decoded, not
 * transformed), the rows below it are never read, and the columns outside it, rounded out to
 * the iMCU grid, are not transformed (jpeg_crop_scanline). The pixels are those of a whole
 * decode sliced to the rectangle: the decoded strip reaches MARGIN pixels past each side of
 * the rectangle where the image goes on, so the smoothing of subsampled colour at the strip's
 * own edge never touches a kept pixel.
 *
 * region(buf, top, left, height, width, out, fast) fills ``out``, a writable buffer of
 * height x width x 3 bytes, with the RGB rectangle at (top, left). ValueError with libjpeg's
 * message for anything libjpeg refuses or warns about, as simplejpeg's strict decode does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

#define MARGIN 8

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} failure;

static void fail(j_common_ptr cinfo) {
    failure *f = (failure *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, f->message);
    longjmp(f->jump, 1);
}

static void warn(j_common_ptr cinfo, int level) {
    if (level < 0) fail(cinfo); /* a warning means damaged data: strict, as the whole decode */
}

static PyObject *region(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    int top, left, height, width, fast;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiiiw*p", &src, &top, &left, &height, &width, &out, &fast))
        return NULL;
    struct jpeg_decompress_struct cinfo;
    failure err;
    unsigned char *volatile strip = NULL; /* volatile: set after setjmp, read after longjmp */
    JSAMPROW *volatile rows = NULL;
    volatile int ok = 0;
    err.message[0] = '\0';
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = fail;
    err.pub.emit_message = warn;
    jpeg_create_decompress(&cinfo);
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(err.jump) == 0) {
        jpeg_mem_src(&cinfo, (const unsigned char *)src.buf, (unsigned long)src.len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.out_color_space = JCS_RGB;
        if (fast) {
            cinfo.dct_method = JDCT_IFAST;
            cinfo.do_fancy_upsampling = FALSE;
        }
        jpeg_start_decompress(&cinfo);
        if (top < 0 || left < 0 || height < 1 || width < 1 ||
            (JDIMENSION)top + height > cinfo.output_height ||
            (JDIMENSION)left + width > cinfo.output_width ||
            out.len != (Py_ssize_t)height * width * 3) {
            strcpy(err.message, "the region lies outside the image or out has the wrong size");
        } else {
            /* MARGIN: the reach of the smoothing of colour subsampled up to 4 times across */
            JDIMENSION x0 = left > MARGIN ? (JDIMENSION)left - MARGIN : 0;
            JDIMENSION x1 = (JDIMENSION)(left + width + MARGIN);
            if (x1 > cinfo.output_width) x1 = cinfo.output_width;
            JDIMENSION xoff = x0, xlen = x1 - x0;
            if (xoff > 0 || xlen < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &xlen);
            size_t stride = (size_t)cinfo.output_width * 3; /* after the crop: xlen pixels */
            if (top > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
            strip = malloc(stride * height);
            rows = malloc(sizeof(JSAMPROW) * height);
            if (strip == NULL || rows == NULL) {
                strcpy(err.message, "out of memory");
            } else {
                for (int i = 0; i < height; i++) rows[i] = strip + stride * i;
                int got = 0, step = 1;
                while (got < height && step > 0)
                    got += step = jpeg_read_scanlines(&cinfo, rows + got, height - got);
                size_t skip = (size_t)(left - xoff) * 3, n = (size_t)width * 3;
                unsigned char *dst = (unsigned char *)out.buf;
                for (int i = 0; i < height; i++) memcpy(dst + n * i, rows[i] + skip, n);
                ok = got == height;
            }
        }
    }
    jpeg_destroy_decompress(&cinfo);
    Py_END_ALLOW_THREADS
    free(strip);
    free(rows);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "JPEG decode failed");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"region", region, METH_VARARGS, "region(buf, top, left, height, width, out, fast)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_region", NULL, -1, methods};

PyMODINIT_FUNC PyInit__region(void) { return PyModule_Create(&module); }
