/*
 * fastfeed._jpegroi: decode one rectangle of a JPEG with libjpeg-turbo's libjpeg API.
 *
 * A RandomResizedCrop keeps about half of an image. libjpeg-turbo can skip the work
 * outside such a crop: jpeg_crop_scanline() limits the IDCT, upsampling and colour
 * conversion to the crop's columns (rounded out to whole iMCUs), jpeg_skip_scanlines()
 * skips the rows above it (entropy decoding only), and the decoder stops after the
 * crop's last row (jpeg_abort_decompress), so nothing below it is decoded at all.
 * Combined with DCT scaling (scale_denom 1, 2, 4, 8) that is the least work libjpeg
 * can do for one crop.
 *
 * Python API (see fastfeed/decode/roi.py, which is the only caller):
 *
 *   header(data) -> (height, width, colorspace)
 *       colorspace: libjpeg's J_COLOR_SPACE number of the stored image.
 *   decode_crop(data, out, scale_denom, top, left, height, width) -> None
 *       Decode rows [top, top + height) and columns [left, left + width) of the image
 *       as scaled by 1/scale_denom (libjpeg's rounded-up scaled size) as RGB into the
 *       writable C-contiguous buffer ``out`` (height * width * 3 bytes). Fast integer
 *       IDCT and fancy upsampling, the same settings as simplejpeg's fastdct=True.
 *
 * Both raise ValueError on anything libjpeg rejects: errors and also warnings
 * (corrupt or truncated data), because the caller then falls back to the decoder
 * that handles them. CMYK/YCCK images raise ValueError as well (unsupported here).
 * The GIL is released while libjpeg runs.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} roi_error;

static void roi_error_exit(j_common_ptr cinfo) {
    roi_error *err = (roi_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* Warnings (msg_level < 0) mean corrupt data: stop, like simplejpeg's strict mode. */
static void roi_emit_message(j_common_ptr cinfo, int msg_level) {
    roi_error *err = (roi_error *)cinfo->err;
    if (msg_level < 0) {
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->jump, 1);
    }
}

static void roi_output_message(j_common_ptr cinfo) { (void)cinfo; }

typedef struct {
    const unsigned char *data;
    unsigned long size;
    unsigned char *out;
    int denom, top, left, height, width;
    /* results */
    int status; /* 0 ok, 1 libjpeg error/warning, 2 unsupported, 3 crop outside image */
    int img_h, img_w, colorspace;
    char message[JMSG_LENGTH_MAX + 64];
} roi_job;

static void init_error(j_decompress_ptr cinfo, roi_error *err) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = roi_error_exit;
    err->pub.emit_message = roi_emit_message;
    err->pub.output_message = roi_output_message;
    err->message[0] = '\0';
}

static void run_header(roi_job *job) {
    struct jpeg_decompress_struct cinfo;
    roi_error err;
    init_error(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        job->status = 1;
        snprintf(job->message, sizeof job->message, "%s", err.message);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    jpeg_mem_src(&cinfo, job->data, job->size);
    jpeg_read_header(&cinfo, TRUE);
    job->img_h = (int)cinfo.image_height;
    job->img_w = (int)cinfo.image_width;
    job->colorspace = (int)cinfo.jpeg_color_space;
    job->status = 0;
    jpeg_destroy_decompress(&cinfo);
}

static void run_crop(roi_job *job) {
    struct jpeg_decompress_struct cinfo;
    roi_error err;
    /* volatile: set after setjmp and read after a longjmp */
    unsigned char *volatile rows = NULL;
    init_error(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        job->status = 1;
        snprintf(job->message, sizeof job->message, "%s", err.message);
        free(rows);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    jpeg_mem_src(&cinfo, job->data, job->size);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK ||
        cinfo.num_components == 2 || cinfo.num_components > 4) {
        job->status = 2;
        snprintf(job->message, sizeof job->message, "colour space %d is not decoded here",
                 (int)cinfo.jpeg_color_space);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)job->denom;
    cinfo.dct_method = JDCT_IFAST;
    cinfo.do_fancy_upsampling = TRUE;
    cinfo.do_block_smoothing = TRUE;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3 || job->top < 0 || job->left < 0 || job->height < 1 || job->width < 1 ||
        (JDIMENSION)job->top + (JDIMENSION)job->height > cinfo.output_height ||
        (JDIMENSION)job->left + (JDIMENSION)job->width > cinfo.output_width) {
        job->status = 3;
        snprintf(job->message, sizeof job->message,
                 "crop rows %d+%d, columns %d+%d outside the %ux%u image at scale 1/%d",
                 job->top, job->height, job->left, job->width, (unsigned)cinfo.output_height,
                 (unsigned)cinfo.output_width, job->denom);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    JDIMENSION xoff = (JDIMENSION)job->left, cw = (JDIMENSION)job->width;
    if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);
    /* libjpeg widened the columns to whole iMCUs: [xoff, xoff + cw) holds the crop */
    size_t skip_cols = (size_t)(job->left - (int)xoff) * 3;
    size_t row_bytes = (size_t)cw * 3, out_row = (size_t)job->width * 3;
    int batch = cinfo.rec_outbuf_height > 0 ? cinfo.rec_outbuf_height : 1;
    JSAMPROW ptrs[16];
    if (batch > 16) batch = 16;
    rows = (unsigned char *)malloc(row_bytes * (size_t)batch);
    if (rows == NULL) {
        job->status = 1;
        snprintf(job->message, sizeof job->message, "out of memory");
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    for (int i = 0; i < batch; i++) ptrs[i] = rows + row_bytes * (size_t)i;
    if (job->top > 0) {
        JDIMENSION want = (JDIMENSION)job->top;
        while (want > 0) {
            JDIMENSION got = jpeg_skip_scanlines(&cinfo, want);
            if (got == 0) break;
            want -= got;
        }
    }
    int done = 0;
    while (done < job->height) {
        JDIMENSION n = jpeg_read_scanlines(&cinfo, ptrs, (JDIMENSION)batch);
        if (n == 0) break;
        for (JDIMENSION i = 0; i < n && done < job->height; i++, done++)
            memcpy(job->out + out_row * (size_t)done, ptrs[i] + skip_cols, out_row);
    }
    free(rows);
    rows = NULL;
    if (done < job->height) {
        job->status = 1;
        snprintf(job->message, sizeof job->message, "decoder stopped after %d of %d rows", done, job->height);
    } else {
        job->status = 0;
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
}

static PyObject *roi_header(PyObject *self, PyObject *args) {
    Py_buffer data;
    roi_job job;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:header", &data)) return NULL;
    memset(&job, 0, sizeof job);
    job.data = (const unsigned char *)data.buf;
    job.size = (unsigned long)data.len;
    Py_BEGIN_ALLOW_THREADS
    run_header(&job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (job.status != 0) {
        PyErr_Format(PyExc_ValueError, "JPEG header: %s", job.message);
        return NULL;
    }
    return Py_BuildValue("(iii)", job.img_h, job.img_w, job.colorspace);
}

static PyObject *roi_decode_crop(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    roi_job job;
    (void)self;
    memset(&job, 0, sizeof job);
    if (!PyArg_ParseTuple(args, "y*w*iiiii:decode_crop", &data, &out, &job.denom, &job.top, &job.left,
                          &job.height, &job.width))
        return NULL;
    if (job.denom != 1 && job.denom != 2 && job.denom != 4 && job.denom != 8) {
        PyErr_Format(PyExc_ValueError, "scale_denom=%d; use 1, 2, 4 or 8", job.denom);
        goto fail;
    }
    if (job.height < 1 || job.width < 1 || !PyBuffer_IsContiguous(&out, 'C') ||
        out.len < (Py_ssize_t)job.height * job.width * 3) {
        PyErr_Format(PyExc_ValueError, "out must be a C-contiguous buffer of at least %d x %d x 3 bytes",
                     job.height, job.width);
        goto fail;
    }
    job.data = (const unsigned char *)data.buf;
    job.size = (unsigned long)data.len;
    job.out = (unsigned char *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    run_crop(&job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (job.status != 0) {
        PyErr_Format(PyExc_ValueError, "JPEG: %s", job.message);
        return NULL;
    }
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return NULL;
}

static PyMethodDef roi_methods[] = {
    {"header", roi_header, METH_VARARGS, "header(data) -> (height, width, jpeg colorspace number)"},
    {"decode_crop", roi_decode_crop, METH_VARARGS,
     "decode_crop(data, out, scale_denom, top, left, height, width): RGB crop of the scaled image into out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef roi_module = {
    PyModuleDef_HEAD_INIT, "_jpegroi",
    "Region-of-interest JPEG decoding with libjpeg-turbo (see fastfeed.decode.roi).", -1, roi_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegroi(void) {
    PyObject *m = PyModule_Create(&roi_module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "JCS_GRAYSCALE", JCS_GRAYSCALE) < 0 ||
        PyModule_AddIntConstant(m, "JCS_RGB", JCS_RGB) < 0 ||
        PyModule_AddIntConstant(m, "JCS_YCbCr", JCS_YCbCr) < 0 ||
        PyModule_AddIntConstant(m, "JCS_CMYK", JCS_CMYK) < 0 ||
        PyModule_AddIntConstant(m, "JCS_YCCK", JCS_YCCK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER);
#endif
    return m;
}
