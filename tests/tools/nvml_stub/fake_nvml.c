/*
 * Stand-in libnvidia-ml.so.1 for the gpufleet.upgrade test suite and lab.
 *
 * It exports the NVML entry points that gpufleet.upgrade's gpu_info uses (through the real
 * nvidia-ml-py binding) and answers them from a plain-text state file whose path is in the
 * environment variable GPUFLEET_FAKE_NVML_STATE. The format is documented in README.md next to
 * this file. The state is (re)read on every nvmlInit*, so one process can switch states.
 *
 * Written for this project from NVML's public API (nvml.h signatures as used by nvidia-ml-py);
 * it is not NVIDIA code. Symbols it does not export make the binding raise
 * NVMLError_FunctionNotFound, as an older real driver would.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_PROCS 64
#define MAX_FAILS 32
#define MAX_XIDS 32
#define MAX_EVENT_SETS 8
#define NAME_LEN 96
#define FN_LEN 80

struct fail { char fn[FN_LEN]; int code; };

struct proc { unsigned int pid; unsigned long long used; char name[256]; };

struct gpu {
    char name[NAME_LEN];
    char uuid[NAME_LEN];
    char bus_id[32];
    unsigned int vendor, device, subvendor, subdevice;
    unsigned int domain, bus, dev;
    unsigned int mig_current, mig_pending;
    unsigned int ecc_current, ecc_pending;
    unsigned long long ecc[2][2]; /* [error type: 0 corrected, 1 uncorrected][counter: 0 volatile, 1 aggregate] */
    unsigned int retired_pending;
    unsigned int remap[4];        /* correctable, uncorrectable, pending, failure */
    unsigned int temperature;
    int nprocs;
    struct proc procs[MAX_PROCS];
    int nfails;
    struct fail fails[MAX_FAILS];
    int nxids;
    unsigned long long xids[MAX_XIDS];
    int xid_next;                 /* next queued Xid to deliver */
};

struct event_set { int used; unsigned long long mask[MAX_GPUS]; };

static struct {
    int initialized;
    char driver_version[80];
    int cuda_version;
    int init_error;
    int nfails;
    struct fail fails[MAX_FAILS];
    int ngpus;
    struct gpu gpus[MAX_GPUS];
    struct event_set sets[MAX_EVENT_SETS];
} S;

static const struct { const char *name; int code; } ERRORS[] = {
    {"UNINITIALIZED", 1}, {"INVALID_ARGUMENT", 2}, {"NOT_SUPPORTED", 3}, {"NO_PERMISSION", 4},
    {"ALREADY_INITIALIZED", 5}, {"NOT_FOUND", 6}, {"INSUFFICIENT_SIZE", 7},
    {"INSUFFICIENT_POWER", 8}, {"DRIVER_NOT_LOADED", 9}, {"TIMEOUT", 10}, {"IRQ_ISSUE", 11},
    {"LIBRARY_NOT_FOUND", 12}, {"FUNCTION_NOT_FOUND", 13}, {"CORRUPTED_INFOROM", 14},
    {"GPU_IS_LOST", 15}, {"RESET_REQUIRED", 16}, {"OPERATING_SYSTEM", 17},
    {"LIB_RM_VERSION_MISMATCH", 18}, {"IN_USE", 19}, {"MEMORY", 20}, {"NO_DATA", 21},
    {"UNKNOWN", 999}, {NULL, 0},
};

/* Texts as NVML's nvmlErrorString gives them. */
static const struct { int code; const char *text; } ERROR_TEXT[] = {
    {0, "Success"}, {1, "Uninitialized"}, {2, "Invalid Argument"}, {3, "Not Supported"},
    {4, "Insufficient Permissions"}, {5, "Already Initialized"}, {6, "Not Found"},
    {7, "Insufficient Size"}, {8, "Insufficient External Power"}, {9, "Driver Not Loaded"},
    {10, "Timeout"}, {11, "Interrupt Request Issue"}, {12, "NVML Shared Library Not Found"},
    {13, "Function Not Found"}, {14, "Corrupted infoROM"}, {15, "GPU is lost"},
    {16, "GPU requires restart"}, {17, "The operating system has blocked the request."},
    {18, "RM has detected an NVML/RM version mismatch."}, {19, "In use by another client"},
    {20, "Insufficient Memory"}, {21, "No data"}, {999, "Unknown Error"}, {-1, NULL},
};

/* Bounded copy that always terminates (long values are cut, never overflow). */
static void setstr(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size)
        n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int parse_error(const char *s)
{
    char *end;
    long v = strtol(s, &end, 0);
    if (*s && *end == '\0')
        return (int)v;
    if (strncmp(s, "NVML_ERROR_", 11) == 0)
        s += 11;
    for (int i = 0; ERRORS[i].name; i++)
        if (strcmp(ERRORS[i].name, s) == 0)
            return ERRORS[i].code;
    return -1;
}

static void add_fail(int *n, struct fail *f, const char *fn, int code)
{
    if (*n >= MAX_FAILS)
        return;
    setstr(f[*n].fn, FN_LEN, fn);
    f[*n].code = code;
    (*n)++;
}

static int lookup_fail(int n, const struct fail *f, const char *fn)
{
    for (int i = 0; i < n; i++)
        if (strcmp(f[i].fn, fn) == 0 || strcmp(f[i].fn, "*") == 0)
            return f[i].code;
    return NVML_SUCCESS;
}

static int syntax(const char *path, int lineno, const char *what, const char *line)
{
    fprintf(stderr, "fake libnvidia-ml: %s:%d: %s: %s\n", path, lineno, what, line);
    return NVML_ERROR_UNKNOWN;
}

static unsigned long long parse_u64(const char *s)
{
    if (strcmp(s, "-") == 0 || strcmp(s, "N/A") == 0)
        return ULLONG_MAX; /* NVML_VALUE_NOT_AVAILABLE */
    return strtoull(s, NULL, 0);
}

static int load_state(void)
{
    const char *path = getenv("GPUFLEET_FAKE_NVML_STATE");
    memset(&S, 0, sizeof(S));
    if (!path || !*path)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    FILE *fp = fopen(path, "r");
    if (!fp)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    char line[1024];
    int lineno = 0, rc = NVML_SUCCESS;
    struct gpu *g = NULL;
    while (rc == NVML_SUCCESS && fgets(line, sizeof(line), fp)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0' || *p == '#')
            continue;
        char key[64] = "";
        int klen = 0;
        while (*p && *p != ' ' && *p != '\t' && klen < 63)
            key[klen++] = *p++;
        key[klen] = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        char *rest = p; /* the value: the rest of the line */
        char a[256] = "", b[256] = "", c[256] = "", d[256] = "";
        int n = sscanf(rest, "%255s %255s %255s %255s", a, b, c, d);

        if (strcmp(key, "driver_version") == 0) {
            setstr(S.driver_version, sizeof(S.driver_version), rest);
        } else if (strcmp(key, "cuda_version") == 0) {
            S.cuda_version = atoi(rest);
        } else if (strcmp(key, "init_error") == 0) {
            S.init_error = parse_error(rest);
            if (S.init_error < 0)
                rc = syntax(path, lineno, "unknown error name", line);
        } else if (strcmp(key, "gpu") == 0) {
            if (S.ngpus >= MAX_GPUS) {
                rc = syntax(path, lineno, "too many GPUs", line);
                break;
            }
            g = &S.gpus[S.ngpus++];
            snprintf(g->uuid, NAME_LEN, "GPU-00000000-0000-0000-0000-%012d", S.ngpus - 1);
            snprintf(g->name, NAME_LEN, "NVIDIA Fake GPU");
            snprintf(g->bus_id, sizeof(g->bus_id), "00000000:%02X:00.0", 0x10 + S.ngpus);
            g->vendor = 0x10de;
            g->subvendor = 0x10de;
        } else if (strcmp(key, "fail") == 0) {
            int code = n == 2 ? parse_error(b) : -1;
            if (code < 0)
                rc = syntax(path, lineno, "expected 'fail <function|*> <error>'", line);
            else if (g)
                add_fail(&g->nfails, g->fails, a, code);
            else
                add_fail(&S.nfails, S.fails, a, code);
        } else if (!g) {
            rc = syntax(path, lineno, "unknown system key (GPU keys come after a 'gpu' line)", line);
        } else if (strcmp(key, "name") == 0) {
            setstr(g->name, NAME_LEN, rest);
        } else if (strcmp(key, "uuid") == 0) {
            setstr(g->uuid, NAME_LEN, rest);
        } else if (strcmp(key, "bus_id") == 0) {
            setstr(g->bus_id, sizeof(g->bus_id), rest);
        } else if (strcmp(key, "pci") == 0 && n == 4) {
            g->vendor = strtoul(a, NULL, 16);
            g->device = strtoul(b, NULL, 16);
            g->subvendor = strtoul(c, NULL, 16);
            g->subdevice = strtoul(d, NULL, 16);
        } else if (strcmp(key, "mig") == 0 && n == 2) {
            g->mig_current = atoi(a);
            g->mig_pending = atoi(b);
        } else if (strcmp(key, "ecc_mode") == 0 && n == 2) {
            g->ecc_current = atoi(a);
            g->ecc_pending = atoi(b);
        } else if (strcmp(key, "ecc_corrected_volatile") == 0) {
            g->ecc[0][0] = parse_u64(a);
        } else if (strcmp(key, "ecc_corrected_aggregate") == 0) {
            g->ecc[0][1] = parse_u64(a);
        } else if (strcmp(key, "ecc_uncorrected_volatile") == 0) {
            g->ecc[1][0] = parse_u64(a);
        } else if (strcmp(key, "ecc_uncorrected_aggregate") == 0) {
            g->ecc[1][1] = parse_u64(a);
        } else if (strcmp(key, "retired_pages_pending") == 0) {
            g->retired_pending = atoi(a);
        } else if (strcmp(key, "remapped_rows") == 0 && n == 4) {
            g->remap[0] = atoi(a);
            g->remap[1] = atoi(b);
            g->remap[2] = atoi(c);
            g->remap[3] = atoi(d);
        } else if (strcmp(key, "temperature") == 0) {
            g->temperature = atoi(a);
        } else if (strcmp(key, "process") == 0 && n >= 2) {
            if (g->nprocs < MAX_PROCS) {
                struct proc *pr = &g->procs[g->nprocs++];
                pr->pid = strtoul(a, NULL, 10);
                pr->used = parse_u64(b);
                /* the name is the rest of the line after pid and memory */
                const char *q = rest;
                for (int skip = 0; skip < 2; skip++) {
                    while (*q && *q != ' ' && *q != '\t')
                        q++;
                    while (*q == ' ' || *q == '\t')
                        q++;
                }
                setstr(pr->name, sizeof(pr->name), q);
            }
        } else if (strcmp(key, "xid") == 0) {
            if (g->nxids < MAX_XIDS)
                g->xids[g->nxids++] = strtoull(a, NULL, 10);
        } else {
            rc = syntax(path, lineno, "unknown or malformed GPU key", line);
        }
    }
    fclose(fp);
    for (int i = 0; i < S.ngpus; i++) {
        struct gpu *x = &S.gpus[i];
        sscanf(x->bus_id, "%x:%x:%x", &x->domain, &x->bus, &x->dev);
    }
    return rc;
}

/* ---- library life cycle ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    int rc = load_state();
    if (rc == NVML_SUCCESS && S.init_error)
        rc = S.init_error;
    S.initialized = rc == NVML_SUCCESS;
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (!S.initialized)
        return NVML_ERROR_UNINITIALIZED;
    S.initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    for (int i = 0; ERROR_TEXT[i].text; i++)
        if (ERROR_TEXT[i].code == result)
            return ERROR_TEXT[i].text;
    return "Unknown Error";
}

/* ---- helpers ---- */

#define SYS_CHECK(fn)                                          \
    do {                                                       \
        if (!S.initialized)                                    \
            return NVML_ERROR_UNINITIALIZED;                   \
        int _f = lookup_fail(S.nfails, S.fails, fn);           \
        if (_f)                                                \
            return _f;                                         \
    } while (0)

static nvmlReturn_t dev_check(struct gpu *g, const char *fn)
{
    if (!S.initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!g || g < S.gpus || g >= S.gpus + S.ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    return lookup_fail(g->nfails, g->fails, fn);
}

#define DEV_CHECK(g, fn)                        \
    do {                                        \
        nvmlReturn_t _r = dev_check((g), fn);   \
        if (_r)                                 \
            return _r;                          \
    } while (0)

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- system queries ---- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    SYS_CHECK("nvmlSystemGetDriverVersion");
    return copy_str(version, length, S.driver_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    SYS_CHECK("nvmlSystemGetCudaDriverVersion");
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = S.cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    SYS_CHECK("nvmlSystemGetCudaDriverVersion_v2");
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = S.cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    SYS_CHECK("nvmlSystemGetProcessName");
    for (int i = 0; i < S.ngpus; i++)
        for (int j = 0; j < S.gpus[i].nprocs; j++)
            if (S.gpus[i].procs[j].pid == pid && S.gpus[i].procs[j].name[0])
                return copy_str(name, length, S.gpus[i].procs[j].name);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    SYS_CHECK("nvmlDeviceGetCount_v2");
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)S.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, struct gpu **device)
{
    SYS_CHECK("nvmlDeviceGetHandleByIndex_v2");
    if (!device || index >= (unsigned int)S.ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = lookup_fail(S.gpus[index].nfails, S.gpus[index].fails, "nvmlDeviceGetHandleByIndex_v2");
    if (r)
        return r;
    *device = &S.gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, struct gpu **device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* ---- device queries ---- */

nvmlReturn_t nvmlDeviceGetIndex(struct gpu *g, unsigned int *index)
{
    DEV_CHECK(g, "nvmlDeviceGetIndex");
    *index = (unsigned int)(g - S.gpus);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(struct gpu *g, char *name, unsigned int length)
{
    DEV_CHECK(g, "nvmlDeviceGetName");
    return copy_str(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetUUID(struct gpu *g, char *uuid, unsigned int length)
{
    DEV_CHECK(g, "nvmlDeviceGetUUID");
    return copy_str(uuid, length, g->uuid);
}

/* nvmlPciInfo_t as nvml.h (v3) lays it out. */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static nvmlReturn_t fill_pci(struct gpu *g, nvmlPciInfo_t *pci)
{
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", g->domain & 0xffff, g->bus, g->dev);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = (g->device << 16) | g->vendor;
    pci->pciSubSystemId = (g->subdevice << 16) | g->subvendor;
    setstr(pci->busId, sizeof(pci->busId), g->bus_id);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(struct gpu *g, nvmlPciInfo_t *pci)
{
    DEV_CHECK(g, "nvmlDeviceGetPciInfo_v3");
    return fill_pci(g, pci);
}

nvmlReturn_t nvmlDeviceGetMigMode(struct gpu *g, unsigned int *current, unsigned int *pending)
{
    DEV_CHECK(g, "nvmlDeviceGetMigMode");
    *current = g->mig_current;
    *pending = g->mig_pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(struct gpu *g, unsigned int *current, unsigned int *pending)
{
    DEV_CHECK(g, "nvmlDeviceGetEccMode");
    *current = g->ecc_current;
    *pending = g->ecc_pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(struct gpu *g, unsigned int errorType, unsigned int counterType,
                                         unsigned long long *count)
{
    DEV_CHECK(g, "nvmlDeviceGetTotalEccErrors");
    if (errorType > 1 || counterType > 1 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->ecc_current)
        return NVML_ERROR_NOT_SUPPORTED; /* as NVML does with ECC disabled */
    *count = g->ecc[errorType][counterType];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(struct gpu *g, unsigned int *pending)
{
    DEV_CHECK(g, "nvmlDeviceGetRetiredPagesPendingStatus");
    *pending = g->retired_pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(struct gpu *g, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure)
{
    DEV_CHECK(g, "nvmlDeviceGetRemappedRows");
    *corr = g->remap[0];
    *unc = g->remap[1];
    *pending = g->remap[2];
    *failure = g->remap[3];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(struct gpu *g, unsigned int sensor, unsigned int *temp)
{
    DEV_CHECK(g, "nvmlDeviceGetTemperature");
    if (sensor != 0 || !temp)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = g->temperature;
    return NVML_SUCCESS;
}

/* nvmlProcessInfo_t (v2/v3 layout). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

static nvmlReturn_t procs(struct gpu *g, unsigned int *count, nvmlProcessInfo_t *infos)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int have = (unsigned int)g->nprocs;
    /* The two-call protocol: a too-small buffer gets the needed size and INSUFFICIENT_SIZE. */
    if (*count < have || (!infos && have)) {
        *count = have;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = have;
    for (unsigned int i = 0; i < have; i++) {
        infos[i].pid = g->procs[i].pid;
        infos[i].usedGpuMemory = g->procs[i].used;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(struct gpu *g, unsigned int *count, nvmlProcessInfo_t *infos)
{
    DEV_CHECK(g, "nvmlDeviceGetComputeRunningProcesses_v3");
    return procs(g, count, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(struct gpu *g, unsigned int *count, nvmlProcessInfo_t *infos)
{
    DEV_CHECK(g, "nvmlDeviceGetComputeRunningProcesses_v2");
    return procs(g, count, infos);
}

/* ---- events (Xid critical errors) ---- */

typedef struct {
    struct gpu *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

#define XID_EVENT 0x8ULL

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(struct gpu *g, unsigned long long *types)
{
    DEV_CHECK(g, "nvmlDeviceGetSupportedEventTypes");
    *types = XID_EVENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(struct event_set **set)
{
    SYS_CHECK("nvmlEventSetCreate");
    for (int i = 0; i < MAX_EVENT_SETS; i++)
        if (!S.sets[i].used) {
            memset(&S.sets[i], 0, sizeof(S.sets[i]));
            S.sets[i].used = 1;
            *set = &S.sets[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlDeviceRegisterEvents(struct gpu *g, unsigned long long types, struct event_set *set)
{
    DEV_CHECK(g, "nvmlDeviceRegisterEvents");
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~XID_EVENT)
        return NVML_ERROR_NOT_SUPPORTED;
    set->mask[g - S.gpus] |= types;
    return NVML_SUCCESS;
}

/* Delivers queued Xids of registered GPUs in order, then NVML_ERROR_TIMEOUT at once (it never
 * sleeps: the tests do not depend on time). */
nvmlReturn_t nvmlEventSetWait_v2(struct event_set *set, nvmlEventData_t *data, unsigned int timeoutms)
{
    (void)timeoutms;
    SYS_CHECK("nvmlEventSetWait_v2");
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < S.ngpus; i++) {
        struct gpu *g = &S.gpus[i];
        if ((set->mask[i] & XID_EVENT) && g->xid_next < g->nxids) {
            memset(data, 0, sizeof(*data));
            data->device = g;
            data->eventType = XID_EVENT;
            data->eventData = g->xids[g->xid_next++];
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(struct event_set *set)
{
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    set->used = 0;
    return NVML_SUCCESS;
}
