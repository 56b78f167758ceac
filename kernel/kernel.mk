# placeholder, replaced by the kernel module work
