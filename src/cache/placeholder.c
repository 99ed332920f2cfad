/* placeholder so the layer links before its first module lands; delete when another file exists */
int ks__cache_placeholder;
