/* Direct reads of __slots__ attributes, shared by the compiled kernels.
 *
 * A slotted class (MessageExt) stores each slot at a fixed byte offset, which
 * its member descriptor knows.  Reading it there skips PyObject_GetAttr's
 * type lookup (about 25 ns on the build machine), which the kernels would
 * otherwise pay several times per message.  Callers check the item's exact
 * type before using an offset, and fall back to getattr for anything else.
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

#endif
