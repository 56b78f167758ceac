package lazypages
