/* Direct reads of __slots__ attributes, shared by the compiled kernels.
 *
 * A slotted class (MessageExt) stores each slot at a fixed byte offset, which
 * its member descriptor knows.  Reading it there skips PyObject_GetAttr's
 * type lookup (about 25 ns on the build machine), which the kernels would
 * otherwise pay several times per message.  Callers check the item's exact
 * type before using an offset, and fall back to getattr for anything else.
 * Writes go the same way: a decoder that fills every slot of a new message
 * skips the dataclass __init__ (a Python call per message).
 */
#ifndef LITE_PUSH_SLOTS_H
#define LITE_PUSH_SLOTS_H

#include "Python.h"
#include "structmember.h"

/* The byte offset of a __slots__ member (T_OBJECT_EX), else -1. */
static Py_ssize_t lite_push_slot_offset(PyObject *descr) {
    if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX) return -1;
    return m->offset;
}

/* The slot's value (borrowed), or NULL when the slot is unset. */
static inline PyObject *lite_push_slot(PyObject *o, Py_ssize_t off) {
    return *(PyObject **)((char *)o + off);
}

/* A new, empty instance of the slotted ``type`` (no __init__ run; every
 * slot unset), or NULL with an exception set. */
static inline PyObject *lite_push_alloc(PyTypeObject *type) {
    return type->tp_alloc(type, 0);
}

/* Store ``value`` in the slot at ``off`` (a new reference; the old value,
 * if any, released). */
static inline void lite_push_slot_put(PyObject *o, Py_ssize_t off, PyObject *value) {
    PyObject **p = (PyObject **)((char *)o + off);
    PyObject *old = *p;
    Py_INCREF(value);
    *p = value;
    Py_XDECREF(old);
}

/* Prefetch for a pass over the list ``items`` (``n`` long) at ``j``: the
 * item ``PREFETCH_FAR`` ahead, and the object in the slot at ``off`` (its
 * key) of the item ``PREFETCH_NEAR`` ahead, fetched by an earlier call,
 * when it is of ``type``.  A dispatch's messages were made a while ago and
 * are out of the cache: a pass that reads each message's key otherwise
 * waits for two memory reads per message, one after the other.  (Always
 * inlined: a function whose only effect is a prefetch is otherwise taken
 * for pure by GCC, and its calls dropped.) */
#define LITE_PUSH_PREFETCH_FAR 16
#define LITE_PUSH_PREFETCH_NEAR 8
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
static inline void lite_push_prefetch_keys(PyObject *items, Py_ssize_t j, Py_ssize_t n,
                                           PyTypeObject *type, Py_ssize_t off) {
#if defined(__GNUC__) || defined(__clang__)
    if (j + LITE_PUSH_PREFETCH_FAR < n)
        __builtin_prefetch(PyList_GET_ITEM(items, j + LITE_PUSH_PREFETCH_FAR), 0, 3);
    if (type != NULL && j + LITE_PUSH_PREFETCH_NEAR < n) {
        PyObject *o = PyList_GET_ITEM(items, j + LITE_PUSH_PREFETCH_NEAR);
        if (Py_TYPE(o) == type) {
            PyObject *k = lite_push_slot(o, off);
            if (k != NULL) __builtin_prefetch(k, 0, 3);
        }
    }
#endif
}

/* The items list of a release entry ``(lane, items)``, or NULL. */
static inline PyObject *lite_push_entry_items(PyObject *e) {
    if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 2) return NULL;
    PyObject *items = PyTuple_GET_ITEM(e, 1);
    return PyList_CheckExact(items) ? items : NULL;
}

/* Prefetch what releasing ``entries`` (a list of ``(lane, items)``
 * tuples, ``items`` a list of messages) reads, a level at a time over all
 * of them: the items lists, their arrays, the messages, then the objects in
 * their slot at ``off`` (their keys, when of ``type``).  The loads of one
 * level are independent of each other, so they overlap; the release itself
 * then finds them in the cache instead of waiting for each in turn (a lane
 * hands its segments back a dispatch after they were routed, long out of
 * the cache).  The first level reads only the tuples: checking a list's
 * type would wait for it.  Always inlined, as above. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
static inline void lite_push_prefetch_releases(PyObject *entries, PyTypeObject *type, Py_ssize_t off) {
#if defined(__GNUC__) || defined(__clang__)
    Py_ssize_t n = PyList_GET_SIZE(entries), i, k;
    PyObject *e, *items, *key;
    for (i = 0; i < n; i++) {
        e = PyList_GET_ITEM(entries, i);
        if (PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 2)
            __builtin_prefetch(PyTuple_GET_ITEM(e, 1), 0, 3);
    }
    for (i = 0; i < n; i++) {
        items = lite_push_entry_items(PyList_GET_ITEM(entries, i));
        if (items != NULL) __builtin_prefetch(((PyListObject *)items)->ob_item, 0, 3);
    }
    for (i = 0; i < n; i++) {
        items = lite_push_entry_items(PyList_GET_ITEM(entries, i));
        for (k = 0; items != NULL && k < PyList_GET_SIZE(items); k++)
            __builtin_prefetch(PyList_GET_ITEM(items, k), 0, 3);
    }
    for (i = 0; type != NULL && i < n; i++) {
        items = lite_push_entry_items(PyList_GET_ITEM(entries, i));
        for (k = 0; items != NULL && k < PyList_GET_SIZE(items); k++) {
            PyObject *o = PyList_GET_ITEM(items, k);
            if (Py_TYPE(o) == type && (key = lite_push_slot(o, off)) != NULL)
                __builtin_prefetch(key, 0, 3);
        }
    }
#endif
}

#endif
