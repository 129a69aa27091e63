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

#endif
