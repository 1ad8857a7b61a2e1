(define (problem plan_hand_written_tomato_microwave)
    (:domain alfred)
    (:objects
        agent1 - agent
        TomatoType - otype
        AppleType - otype
        MugType - otype
        CounterTopType - rtype
        MicrowaveType - rtype
        FridgeType - rtype
        CabinetType - rtype
        Tomato_bar__minus_01_dot_10_bar__plus_00_dot_95_bar__plus_00_dot_50 - object
        Apple_bar__plus_00_dot_20_bar__plus_00_dot_95_bar__minus_00_dot_30 - object
        Mug_bar__plus_01_dot_40_bar__plus_01_dot_60_bar__plus_00_dot_80 - object
        CounterTop_bar__minus_01_dot_00_bar__plus_00_dot_90_bar__plus_00_dot_50 - receptacle
        Microwave_bar__plus_01_dot_50_bar__plus_01_dot_00_bar__minus_01_dot_20 - receptacle
        Fridge_bar__plus_00_dot_20_bar__plus_00_dot_00_bar__minus_00_dot_30 - receptacle
        Cabinet_bar__plus_01_dot_40_bar__plus_01_dot_50_bar__plus_00_dot_80 - receptacle
        loc_bar_start - location
        loc_bar_countertop - location
        loc_bar_microwave - location
        loc_bar_fridge - location
        loc_bar_cabinet - location
    )
    (:init
        (atLocation agent1 loc_bar_start)
        (receptacleType CounterTop_bar__minus_01_dot_00_bar__plus_00_dot_90_bar__plus_00_dot_50 CounterTopType)
        (receptacleType Microwave_bar__plus_01_dot_50_bar__plus_01_dot_00_bar__minus_01_dot_20 MicrowaveType)
        (receptacleType Fridge_bar__plus_00_dot_20_bar__plus_00_dot_00_bar__minus_00_dot_30 FridgeType)
        (receptacleType Cabinet_bar__plus_01_dot_40_bar__plus_01_dot_50_bar__plus_00_dot_80 CabinetType)
        (receptacleAtLocation CounterTop_bar__minus_01_dot_00_bar__plus_00_dot_90_bar__plus_00_dot_50 loc_bar_countertop)
        (receptacleAtLocation Microwave_bar__plus_01_dot_50_bar__plus_01_dot_00_bar__minus_01_dot_20 loc_bar_microwave)
        (receptacleAtLocation Fridge_bar__plus_00_dot_20_bar__plus_00_dot_00_bar__minus_00_dot_30 loc_bar_fridge)
        (receptacleAtLocation Cabinet_bar__plus_01_dot_40_bar__plus_01_dot_50_bar__plus_00_dot_80 loc_bar_cabinet)
        (openable Microwave_bar__plus_01_dot_50_bar__plus_01_dot_00_bar__minus_01_dot_20)
        (openable Fridge_bar__plus_00_dot_20_bar__plus_00_dot_00_bar__minus_00_dot_30)
        (openable Cabinet_bar__plus_01_dot_40_bar__plus_01_dot_50_bar__plus_00_dot_80)
        (objectType Tomato_bar__minus_01_dot_10_bar__plus_00_dot_95_bar__plus_00_dot_50 TomatoType)
        (objectType Apple_bar__plus_00_dot_20_bar__plus_00_dot_95_bar__minus_00_dot_30 AppleType)
        (objectType Mug_bar__plus_01_dot_40_bar__plus_01_dot_60_bar__plus_00_dot_80 MugType)
        (pickupable Tomato_bar__minus_01_dot_10_bar__plus_00_dot_95_bar__plus_00_dot_50)
        (pickupable Apple_bar__plus_00_dot_20_bar__plus_00_dot_95_bar__minus_00_dot_30)
        (pickupable Mug_bar__plus_01_dot_40_bar__plus_01_dot_60_bar__plus_00_dot_80)
        (heatable Tomato_bar__minus_01_dot_10_bar__plus_00_dot_95_bar__plus_00_dot_50)
        (coolable Tomato_bar__minus_01_dot_10_bar__plus_00_dot_95_bar__plus_00_dot_50)
        (inReceptacle Tomato_bar__minus_01_dot_10_bar__plus_00_dot_95_bar__plus_00_dot_50 CounterTop_bar__minus_01_dot_00_bar__plus_00_dot_90_bar__plus_00_dot_50)
        (objectAtLocation Tomato_bar__minus_01_dot_10_bar__plus_00_dot_95_bar__plus_00_dot_50 loc_bar_countertop)
        (inReceptacle Apple_bar__plus_00_dot_20_bar__plus_00_dot_95_bar__minus_00_dot_30 Fridge_bar__plus_00_dot_20_bar__plus_00_dot_00_bar__minus_00_dot_30)
        (objectAtLocation Apple_bar__plus_00_dot_20_bar__plus_00_dot_95_bar__minus_00_dot_30 loc_bar_fridge)
        (inReceptacle Mug_bar__plus_01_dot_40_bar__plus_01_dot_60_bar__plus_00_dot_80 Cabinet_bar__plus_01_dot_40_bar__plus_01_dot_50_bar__plus_00_dot_80)
        (objectAtLocation Mug_bar__plus_01_dot_40_bar__plus_01_dot_60_bar__plus_00_dot_80 loc_bar_cabinet)
        (canContain MicrowaveType TomatoType)
        (canContain MicrowaveType MugType)
        (canContain CounterTopType TomatoType)
        (canContain CounterTopType AppleType)
        (canContain CounterTopType MugType)
        (canContain FridgeType TomatoType)
        (canContain FridgeType AppleType)
        (canContain FridgeType MugType)
        (canContain CabinetType MugType)
    )
    (:goal
        (and
            (exists (?r - receptacle)
                (exists (?o - object)
                    (and
                        (inReceptacle ?o ?r)
                        (objectType ?o TomatoType)
                        (receptacleType ?r MicrowaveType)
                    )
                )
            )
        )
    )
)
