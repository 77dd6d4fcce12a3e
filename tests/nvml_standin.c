/*
 * A stand-in libnvidia-ml.so.1 for tests on hosts without an NVIDIA GPU.
 *
 * It implements, with NVML's C ABI, exactly the calls envlock's probe makes through ctypes
 * (envlock/probe.py, _CtypesNvml) or through nvidia-ml-py (_PyNvml), and nothing else, so a probe that starts calling something
 * new fails loudly here instead of silently reading garbage. Two devices: an "A100" in MIG mode
 * and an "H100" without. Behaviour is chosen at run time by environment variables, so one
 * build serves every case:
 *
 *   STANDIN_NVML_MODE    ok (default) | fail (nvmlInit returns NVML_ERROR_DRIVER_NOT_LOADED)
 *                        | hang (nvmlInit never returns, like a wedged driver)
 *   STANDIN_NVML_DRIVER  driver version string (default 580.82.07)
 *   STANDIN_NVML_CUDA    the CUDA version the driver supports, as NVML encodes it (default 13000)
 *   STANDIN_NVML_CC      compute capabilities of the two devices, "MAJOR.MINOR,MAJOR.MINOR"
 *                        (default 8.0,9.0: another GPU against the same torch build)
 *
 * Build: gcc -shared -fPIC -o libnvidia-ml.so.1 nvml_standin.c
 * The values below are mirrored by tests/test_scenarios_gpu.py (EXPECTED_GPU).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct standin_device *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

struct standin_device {
    const char *name;
    const char *uuid;
    int cc_major, cc_minor;
    unsigned long long memory_total;
    unsigned int mig_current, mig_pending;
};

static struct standin_device devices[2] = {
    {"NVIDIA A100-SXM4-80GB", "GPU-11111111-2222-3333-4444-555555555555", 8, 0,
     81920ULL << 20, 1, 1},
    {"NVIDIA H100 80GB HBM3", "GPU-66666666-7777-8888-9999-000000000000", 9, 0,
     81559ULL << 20, 0, 0},
};

static int initialised = 0;

static const char *mode(void) {
    const char *m = getenv("STANDIN_NVML_MODE");
    return m ? m : "ok";
}

static nvmlReturn_t copy_string(const char *value, char *buf, unsigned int len) {
    if (buf == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, value);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) {
    if (strcmp(mode(), "hang") == 0) {
        for (;;) pause();
    }
    if (strcmp(mode(), "fail") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    initialised = 1;
    return NVML_SUCCESS;
}

/* nvidia-ml-py's nvmlInit() calls this one. */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised = 0;
    return NVML_SUCCESS;
}

/* The strings NVML itself returns for these codes. */
const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *v = getenv("STANDIN_NVML_DRIVER");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return copy_string(v ? v : "580.82.07", version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cuda_driver_version) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (cuda_driver_version == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const char *v = getenv("STANDIN_NVML_CUDA");
    *cuda_driver_version = v ? atoi(v) : 13000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= 2 || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_string(device->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_string(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || major == NULL || minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->cc_major;
    *minor = device->cc_minor;
    const char *cc = getenv("STANDIN_NVML_CC");
    if (cc != NULL) {
        int m0, n0, m1, n1;
        if (sscanf(cc, "%d.%d,%d.%d", &m0, &n0, &m1, &n1) != 4) return NVML_ERROR_INVALID_ARGUMENT;
        *major = device == &devices[0] ? m0 : m1;
        *minor = device == &devices[0] ? n0 : n1;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->memory_total;
    memory->used = 512ULL << 20;
    memory->free = device->memory_total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || current == NULL || pending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *current = device->mig_current;
    *pending = device->mig_pending;
    return NVML_SUCCESS;
}
