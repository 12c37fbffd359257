"""The messages of a collective save's planning, and rank 0's answer to them.

Every rank describes its part of the state (``report``: a 49-byte hello, then, when the
layout is new, its report: its shape, its boxes, its values); rank 0 reads the reports
one at a time, joins them into one tensor table, tree and plan (``union``), decides who
writes each box held by several ranks (``writers``), and answers (``answer``: "same",
"full", or the plan in parts each rank reads its share of). ``engine.save.plan_exchange``
carries these messages through the store; nothing here does I/O.
"""
