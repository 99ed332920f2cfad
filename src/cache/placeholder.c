/* placeholder so the layer links before its first module lands */
int ks__cache_placeholder;
