/* SparkRing status codes: the one list every native part answers with (the engines, the progress
 * thread, the GPU producer) and transport/errors.py turns into exceptions. C and CUDA alike. */
#ifndef SR_STATUS_H
#define SR_STATUS_H

enum sr_status {
    SR_OK = 0,
    SR_ETIMEOUT = 1,  /* the bound passed */
    SR_ECLOSED = 2,   /* the peer closed or reset the connection */
    SR_ECORRUPT = 3,  /* a checksum did not match */
    SR_ESEQ = 4,      /* a frame out of sequence */
    SR_EPROTO = 5,    /* bad magic, version, kind, rank or length */
    SR_EIO = 6,       /* a system call failed */
    SR_EARG = 7,      /* the caller passed something invalid */
};

#endif
