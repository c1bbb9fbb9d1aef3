"""The plan: what to pack (a folder, an im2rec list, a listing, another set) and every option,
fixed before any image is read."""
