int ks__server_placeholder;
