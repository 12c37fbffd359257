"""Planning: turn a state into items, items into file layouts, wanted chunks into reads."""
