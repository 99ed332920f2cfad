/*
 * config_int.h — shared by config.c and config_yaml.c.
 */
#ifndef KS_CONFIG_INT_H
#define KS_CONFIG_INT_H

#include <stddef.h>

#include "config/config.h"

#define N_MODELS_MAX ((int)(sizeof(((ks_config *)0)->models) / sizeof(((ks_config *)0)->models[0])))
#define MODEL_KEY_MAX ((int)sizeof(((ks_config *)0)->model_keys[0]))

/* The user's home directory ($HOME, else the password database, else "/"). */
const char *ks__config_home_dir(void);
/* Expands ~ and $NAME / ${NAME} in a path (config.c): 0, or -1 with the
 * reason in why. */
int ks__config_expand_path(const char *in, char *out, size_t outlen, char *why, size_t whylen);
/* The defaults of one models.<name> entry. */
void ks__config_model_defaults(ks_model_cache_cfg *m);

#endif
